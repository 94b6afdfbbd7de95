-- sluice: give back what an admitted request consumed.
--
-- On Redis Cluster a decision that involves a global valve is two calls on
-- two slots: the tenant's rules, then the valve. When the valve denies after
-- the tenant's rules admitted, this script undoes the tenant's consumption,
-- so that a denied request consumes nothing.
--
-- It also releases a concurrency lease (`/v1/release`, the end of a
-- response): the same call, naming the lease.
--
-- KEYS[1..m]          the keys the decision wrote (rules of one group
--                     name the same key)
-- ARGV[1], ARGV[2]    the rules and the header, as the decision takes them
--                     (see arguments in common.lua); the lease is the one
--                     to release of concurrency rules ("": none)
-- ARGV[3]             the admission time (ms, as the decision script
--                     returned it)
--
-- Returns how many concurrency rules held the lease, unexpired.
--
-- Each undo is the inverse of the admission, applied to the state as it is
-- now (others may have consumed since): gcra moves its TAT back by
-- cost·per/limit, token_bucket adds the tokens back, the window algorithms
-- take the units off the window they were counted in (if it is still
-- there), sliding_log removes that many entries of the admission time,
-- concurrency removes the lease. TTLs are kept.

bind()
local rules, n, now, lease = arguments(ARGV)
local at = num(ARGV[3])
local released = 0
local pos = 1
for _ = 1, n do
  local algorithm, _, _, k, limit, per, burst, cost, name, after = sunpack(RULE, rules, pos)
  pos = after
  local key = KEYS[k]
  if algorithm == 6 then
    if lease ~= '' then
      local expires = call('ZSCORE', key, lease)
      if expires then
        call('ZREM', key, lease)
        if num(expires) > now then released = released + 1 end
      end
    end
  elseif algorithm == 3 then
    local members = call('ZRANGEBYSCORE', key, at, at, 'LIMIT', 0, cost)
    if #members > 0 then
      call('ZREM', key, unpack(members))
    end
  else
    local value = call('GET', key)
    local pos = value and find_record(value, name)
    if pos then
      local idle, a, b, c = sunpack(STATE, value, pos + 8)
      local updated = true
      if algorithm == 1 then
        -- TAT = ms + frac/limit; subtract cost·per/limit, borrowing whole
        -- milliseconds (never multiplying ms by limit: beyond 2^53).
        local need = cost * per
        if b >= need then
          b = b - need
        else
          local borrow = idiv(need - b + limit - 1, limit)
          a = a - borrow
          b = b + borrow * limit - need
        end
      elseif algorithm == 2 then
        a = min(burst * per, a + cost * per)
      elseif algorithm == 4 then
        local window = idiv(at, per) * per
        if a == window then
          c = max(0, c - cost)
        elseif a == window + per then
          b = max(0, b - cost)
        else
          updated = false
        end
      elseif at >= a and at < a + per then
        b = max(0, b - cost)
      else
        updated = false
      end
      if updated then
        -- The record rewritten in place; when it goes idle is kept (a
        -- refund only makes the state fresher sooner).
        value = sub(value, 1, pos - 1) .. spack(RECORD, name, idle, a, b, c)
          .. sub(value, pos + RECORD_BYTES)
        call('SET', key, value, 'KEEPTTL')
      end
    end
  end
end
return released
