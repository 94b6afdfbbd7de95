-- sluice: helpers shared by the scripts (prepended to each).

-- Globals read once (each global access is a table lookup), by bind():
-- a Redis Function's library is loaded where no global is visible, so it
-- binds them on its first call; a script binds them on every call.
local max, min, num, call, format, find, sub, spack, sunpack, unpack, concat

local function bind()
  max, min, num, call = math.max, math.min, tonumber, redis.call
  format, find, sub = string.format, string.find, string.sub
  spack, sunpack = struct.pack, struct.unpack
  unpack, concat = _G.unpack, table.concat
end

-- floor(a / b) for integers a >= 0, b > 0 with a + b < 2^53 (sluice's
-- values stay under 2^52): exact despite doubles. Write a = N·b - r with
-- 0 < r < b (otherwise a / b is exactly N or above it by at least 1/b):
-- a / b = N - r/b lies at least 1/b under N, more than half a unit in
-- the last place of N (N·b <= a + b < 2^53), so the correctly rounded
-- division stays under N and its floor is N - 1. Tested over the whole
-- domain in redis_differential.rs. floor(q) is written q - q % 1: the VM
-- computes % inline (q - floor(q / 1) * 1, exact), where math.floor is a
-- call into C that costs more than the division; the hot paths write it
-- out the same way.
local function idiv(a, b)
  local q = a / b
  return q - q % 1
end

local function ceil_div(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- A group's value: the records of the rules of one scope whose state is a
-- few numbers, RECORD_BYTES each: the rule's name (8 bytes), when its state
-- goes idle (ms), and three numbers of state (unused ones 0), as
-- little-endian doubles (redis/inspect.rs reads them the same way).
local RECORD, STATE, RECORD_BYTES = '<c8dddd', '<dddd', 40

-- Where the record named name starts in value, or nil.
local function find_record(value, name)
  local from = 1
  while true do
    local at = find(value, name, from, true)
    if not at then return nil end
    if at % RECORD_BYTES == 1 and at + RECORD_BYTES - 1 <= #value then return at end
    from = at + 1
  end
end

-- A key's expiry in ms, as SET's PX is sent. Redis prints a number
-- argument with snprintf("%.17g") on every call (luaArgsToRedisArgv), a
-- string it only copies: a Redis Function's library, loaded once, keeps
-- the strings it sends in px_text (which function.rs's library sets), the
-- ms rounded up to a multiple of 64 (a key lives at most 63 ms longer,
-- never shorter) so that few strings serve every call; at most 4096 are
-- kept (beyond, the table starts afresh). A script, which makes its tables
-- afresh on every call, sends the number.
local px_text

local function expiry(ms)
  if not px_text then
    if ms < 1 then return 1 end
    return ms
  end
  local q = (ms + 63) / 64
  q = q - q % 1
  if q < 1 then q = 1 end
  local text = px_text[q]
  if text then return text end
  if px_text.n >= 4096 then px_text = { n = 0 } end
  text = format('%d', q * 64)
  px_text[q], px_text.n = text, px_text.n + 1
  return text
end

-- The time in ms: arg, or the server's clock (TIME) when arg is "". The
-- seconds change once a second: they are parsed once (equal strings are
-- one object in Lua, so comparing them costs nothing). TIME's strings are
-- read by arithmetic, which converts a string exactly as tonumber does
-- (both luaO_str2d) without a call into C.
local seconds, seconds_ms

local function now_ms(arg)
  if arg ~= '' then return num(arg) end
  local t = call('TIME')
  if t[1] ~= seconds then
    seconds, seconds_ms = t[1], t[1] * 1000
  end
  local ms = t[2] / 1000
  return seconds_ms + ms - ms % 1
end

-- The arguments the decision and the refund both start with (args.rs
-- writes them):
--
-- ARGV[1]  the rules, packed one after another (struct RULE, RULE_BYTES
--          each): per rule its algorithm, aligned, shadow, the index k of
--          its key (KEYS[k]), limit, per, burst, cost, max_debt and its
--          record's name (algorithm: 1 gcra, 2 token_bucket, 3 sliding_log,
--          4 sliding_window, 5 fixed_window, 6 concurrency; aligned and
--          shadow: 1 or 0). Packed, the numbers cost no string parsing
--          (tonumber is the dearest step of a call); in one argument, a
--          further rule costs Redis no argument of its own to read and set
--          up.
-- ARGV[2]  absent or "" (the commonest: no argument to set up): the
--          server's clock (TIME), no lease; otherwise "NOW;LEASE": now in
--          ms (tests only; "" for the server's clock) and the lease of
--          concurrency rules (32 hex digits, or "")
local RULE, RULE_BYTES = '<BBBHdddddc8', 53

-- The rules of a call's ARGV, how many, now and the lease. Each rule is
-- read in turn with sunpack(RULE, rules, pos), which also returns where the
-- next one starts.
local function arguments(ARGV)
  local rules, header = ARGV[1], ARGV[2]
  local n = #rules / RULE_BYTES
  if header == nil or header == '' then
    return rules, n, now_ms(''), ''
  end
  local split = find(header, ';', 1, true)
  return rules, n, now_ms(sub(header, 1, split - 1)), sub(header, split + 1)
end

-- What of cost units that an admission at `at` took from a gcra or
-- token_bucket rule a give-back at now returns, in units x per (parts of a
-- unit count): the larger of what their own refill leaves and, when whole
-- (when the bucket as the admission left it was whole again; 0: not known)
-- is known and no give-back was made since (given, the latest one's time),
-- what lies above whole - 1 ms. The twin of Rule::returnable (compared
-- before multiplying, so products stay under 2^53).
local function returnable(cost, at, whole, given, now, limit, per)
  local need = cost * per
  local own_ms = ceil_div(need, limit)
  local held = 0
  local since = max(0, now - at)
  if since < own_ms then held = need - since * limit end
  if whole ~= 0 and given < at then
    local left = whole - 1 - now
    if left >= own_ms then return need end
    if left > 0 and left * limit > held then held = left * limit end
  end
  return min(need, held)
end

-- While rotating the pepper: each of the m keys KEYS[1..m] not yet under
-- the new pepper starts from its state under the previous one,
-- KEYS[m + k] (decide.lua and adjust.lua).
local function adopt_previous(KEYS, m)
  for k = 1, m do
    if call('EXISTS', KEYS[k]) == 0 and call('EXISTS', KEYS[m + k]) == 1 then
      call('COPY', KEYS[m + k], KEYS[k])
    end
  end
end

-- The functions of the rules shared across regions (regions/shared.lua
-- sets it): made on first use, so that a script, which runs its whole text
-- on every call, makes none of them for a call without shared rules.
local regions

-- Gives back cost units of one rule that an admission at `at` consumed,
-- from its state as it is now (others may have consumed since), and
-- releases lease from a concurrency rule; returns 1 when that lease was
-- still held (see refund.lua). The twin of Rule::refund and Rule::release.
--
-- whole (gcra and token_bucket; nil for an undo right after the
-- admission, which gives back everything): when the units would have
-- refilled had nothing else happened (0: not known). Only what is still
-- held is given back (returnable), so that units the bucket refilled
-- already are not given twice. The record's third number keeps the time
-- of the latest give-back (decisions and debits keep it). previous (while
-- rotating the pepper): the record's name under the previous one, where
-- it is found when not yet under its own. A shared sliding window (8) is
-- sluice-core's regions::sliding::Slide::give_back.
local function give_back(key, algorithm, limit, per, burst, cost, name, at, now, lease, whole,
                         previous)
  local released = 0
  if algorithm == 6 then
    if lease ~= '' then
      local expires = call('ZSCORE', key, lease)
      if expires then
        call('ZREM', key, lease)
        if num(expires) > now then released = 1 end
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
    -- While rotating, a record not yet under its new name.
    if previous and value and not pos then pos = find_record(value, previous) end
    if pos then
      local idle, a, b, c = sunpack(STATE, value, pos + 8)
      local updated = true
      -- What is given back of a gcra or token_bucket rule, in units x per.
      local need = cost * per
      if whole and algorithm <= 2 then
        need = returnable(cost, at, whole, c, now, limit, per)
      end
      if algorithm <= 2 then c = max(c, now) end
      if algorithm == 1 then
        -- TAT = ms + frac/limit; subtract need/limit, borrowing whole
        -- milliseconds (never multiplying ms by limit: beyond 2^53).
        if b >= need then
          b = b - need
        else
          local borrow = idiv(need - b + limit - 1, limit)
          a = a - borrow
          b = b + borrow * limit - need
        end
      elseif algorithm == 2 then
        a = min(burst * per, a + need)
      elseif algorithm == 4 then
        local window = idiv(at, per) * per
        if a == window then
          c = max(0, c - cost)
        elseif a == window + per then
          b = max(0, b - cost)
        else
          updated = false
        end
      elseif algorithm == 9 then
        -- A shared gcra or token_bucket (tokens, -at, moved;
        -- Bucket::give_back): what it still holds, when it and the record
        -- are of the epoch of now.
        local r = regions()
        local e = r.bucket_epoch(per)
        updated = false
        if b < 0 and idiv(at, e) == idiv(-b, e) and idiv(at, e) == idiv(now, e) and at <= now then
          local tokens, last = r.bucket_settled(a, -b, c, now, limit, burst)
          local rate = max(0, limit + c)
          local held = cost * per - (now - at) * rate
          if held > 0 then
            a, b = min(r.bucket_capacity(rate, burst), tokens + held), -last
            updated = true
          end
        end
      elseif algorithm == 8 then
        -- A shared sliding_window (start, carried, net; Slide::give_back).
        if at >= a and at < a + per then
          if c > 0 then c = max(0, c - cost) end
        elseif at < a and at + per >= a then
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
  return released
end
