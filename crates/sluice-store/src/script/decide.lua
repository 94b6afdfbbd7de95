-- sluice: decide every rule of one request, atomically, in one call.
--
-- The arithmetic is the same as sluice-core's algorithms, step for step, on
-- integers below 2^53 (exact in Lua's doubles); a differential test holds
-- the two to identical answers.
--
-- KEYS[1..n]          the rules' keys
-- KEYS[n+1..2n]       (only while rotating the pepper) the same buckets
--                     under the previous pepper
-- ARGV[1]             now in ms, or "" to read the server clock (TIME);
--                     sluice sends "" except in tests
-- ARGV[2]             the lease an admission takes of each concurrency
--                     rule (32 hex digits), or "": concurrency rules only
--                     check
-- ARGV[2 + i]         rule i, packed (struct '<BBBdddd', see RULE):
--                     algorithm, aligned, shadow, limit, per, burst, cost
--                     (algorithm: 1 gcra, 2 token_bucket, 3 sliding_log,
--                     4 sliding_window, 5 fixed_window, 6 concurrency;
--                     aligned and shadow: 1 or 0). Packed, the numbers
--                     cost no string parsing (tonumber is the dearest step
--                     of a call), and a call has few arguments to set up.
--
-- n is #ARGV - 2; previous-pepper keys follow when #KEYS is 2n.
--
-- Returns a string of little-endian doubles: the admission time (ms) a
-- refund of this decision would name, then per rule allowed (1 or 0),
-- remaining, reset_after_ms and retry_after_ms; converting a string costs
-- Redis a fraction of what a table of integers does. Every rule is checked
-- first; only when
-- every enforced rule admits is anything written, so a denied request
-- consumes nothing. A shadow rule never blocks the others and consumes only
-- when it admits. Every key written expires when its state is as good as
-- fresh, plus SLACK ms.
--
-- A state stamped later than now (this node's clock is behind the one that
-- wrote it: a step back, a failover) is first re-dated to now, keeping
-- what was consumed (sluice-core's Rule::repair); the repair is written
-- even when the request is denied, so that it happens once and nobody
-- waits out the step.

local SLACK = 1000

-- A rule's argument, and the reply's layout for n rules (made once per n).
local RULE = '<BBBdddd'
local REPLY = {}

-- Reused by every call of a loaded library (one call runs at a time): a
-- table built afresh costs its allocation, growth and collection. A call
-- sets every slot it reads. writes holds, per rule, flat: the state to
-- write, when it goes idle, the repaired state, when that goes idle, and
-- the algorithm and cost it is written for.
local reply, writes = {}, {}

-- Each algorithm returns allowed, remaining, reset, retry and, when it
-- admits, the state to write and when that state goes idle; when the
-- stored state had to be repaired, also the repaired state and when it
-- goes idle (written when nothing else is).

local function gcra(value, now, cost, limit, per, burst)
  local ms, frac = 0, 0
  if value then
    ms, frac = dec(value)
    frac = frac or 0
  end
  if frac >= limit then
    local q = idiv(frac, limit)
    ms, frac = ms + q, frac - q * limit
  end
  local capacity = burst * per
  local fix, fix_idle
  if ms > now then
    local ahead_ms = ms - now
    if ahead_ms > idiv(capacity, limit) + 1 or ahead_ms * limit + frac > capacity then
      local q = idiv(capacity, limit)
      ms, frac = now + q, capacity - q * limit
      if frac == 0 then fix = enc(ms) else fix = enc(ms, frac) end
      fix_idle = ms
      if frac > 0 then fix_idle = ms + 1 end
    end
  end
  local bms, bfrac = now, 0
  if ms > now or (ms == now and frac > 0) then
    bms, bfrac = ms, frac
  end
  local total = bfrac + cost * per
  local q = idiv(total, limit)
  local nms, nfrac = bms + q, total - q * limit
  local next_ahead = (nms - now) * limit + nfrac
  local nround = 0
  if nfrac > 0 then nround = 1 end
  if next_ahead <= capacity then
    local encoded
    if nfrac == 0 then encoded = enc(nms) else encoded = enc(nms, nfrac) end
    return 1, idiv(capacity - next_ahead, per), nms - now + nround, 0, encoded, nms + nround,
      fix, fix_idle
  end
  local base_ahead = (bms - now) * limit + bfrac
  local remaining = 0
  if capacity > base_ahead then remaining = idiv(capacity - base_ahead, per) end
  local bround = 0
  if bfrac > 0 then bround = 1 end
  return 0, remaining, bms - now + bround, max(1, ceil_div(next_ahead - capacity, limit)),
    nil, nil, fix, fix_idle
end

local function token_bucket(value, now, cost, limit, per, burst)
  local capacity = burst * per
  local available, last = capacity, now
  local fix, fix_idle
  if value then
    local tokens, at = dec(value)
    if at > now then
      -- Refilled "later" than now: the same tokens, refilling from now.
      at = now
      fix = enc(tokens, now)
      fix_idle = now + ceil_div(max(0, capacity - tokens), limit)
    end
    available = min(capacity, tokens + (now - at) * limit)
  end
  local need = cost * per
  if available >= need then
    local left = available - need
    local full_in = ceil_div(capacity - left, limit)
    return 1, idiv(left, per), full_in, 0, enc(left, last), last + full_in, fix, fix_idle
  end
  return 0, idiv(available, per), ceil_div(capacity - available, limit),
    max(1, ceil_div(need - available, limit)), nil, nil, fix, fix_idle
end

local function fixed_window(value, now, cost, limit, per, aligned)
  local start, count = 0, 0
  if value then
    start, count = dec(value)
  end
  local fix, fix_idle
  local current = now
  if aligned == 1 then current = idiv(now, per) * per end
  if value and start > current then
    -- A window that starts "later": the window of now, same count.
    start = current
    fix, fix_idle = enc(start, count), start + per
  end
  if aligned == 1 then
    if start ~= current then start, count = current, 0 end
  elseif count == 0 or now >= start + per then
    start, count = now, 0
  end
  local ends_in = max(1, start + per - now)
  if count + cost <= limit then
    return 1, limit - count - cost, ends_in, 0, enc(start, count + cost), start + per,
      fix, fix_idle
  end
  return 0, max(0, limit - count), ends_in, ends_in, nil, nil, fix, fix_idle
end

local function sliding_window(value, now, cost, limit, per)
  local wstart, prev, cur = 0, 0, 0
  if value then
    wstart, prev, cur = dec(value)
  end
  local start = idiv(now, per) * per
  local fix, fix_idle
  if value and wstart > start then
    -- Windows that start "later": moved to the window of now, same counts.
    wstart = start
    fix, fix_idle = enc(start, prev, cur), start + 2 * per
  end
  local p, c = 0, 0
  if wstart == start then
    p, c = prev, cur
  elseif wstart + per == start then
    p, c = cur, 0
  end
  local elapsed = now - start
  local capacity = limit * per
  local weighted = p * (per - elapsed) + c * per
  local need = cost * per
  if weighted + need <= capacity then
    return 1, idiv(capacity - weighted - need, per), start + 2 * per - now, 0,
      enc(start, p, c + cost), start + 2 * per, fix, fix_idle
  end
  local remaining = 0
  if capacity > weighted then remaining = idiv(capacity - weighted, per) end
  local reset = start + per - now
  if c > 0 then reset = start + 2 * per - now end
  local retry
  if c + cost <= limit and p > 0 then
    local at = per - min(idiv((limit - c - cost) * per, p), per)
    if at < per then retry = at - elapsed end
  end
  if not retry then
    local at = 0
    if c > 0 then at = per - min(idiv((limit - cost) * per, c), per) end
    retry = per - elapsed + at
  end
  return 0, remaining, reset, max(1, retry), nil, nil, fix, fix_idle
end

-- sliding_log keeps one sorted-set member per admitted unit, scored by its
-- admission time and named "time;seq" (seq zero-padded, so that members of
-- one score sort by seq). New members continue after the highest seq of
-- their score: a refund that removed some members can never make a later
-- name collide with one still there (a collision would record nothing).
local function log_add(key, at, units)
  local seq = 0
  local top = call('ZREVRANGEBYSCORE', key, at, at, 'LIMIT', 0, 1)
  if top[1] then
    local sep = string.find(top[1], ';', 1, true)
    if sep then seq = num(string.sub(top[1], sep + 1)) end
  end
  local args = {}
  for i = 1, units do
    args[#args + 1] = at
    args[#args + 1] = string.format('%d;%010d', at, seq + i)
    if #args >= 2000 then
      call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then call('ZADD', key, unpack(args)) end
end

local function sliding_log(key, now, cost, limit, per)
  -- Members admitted "later" than now count as admitted now (written at
  -- once: the repair happens whatever the decision).
  local future = call('ZRANGEBYSCORE', key, '(' .. now, '+inf')
  if #future > 0 then
    for i = 1, #future, 2000 do
      call('ZREM', key, unpack(future, i, min(i + 1999, #future)))
    end
    log_add(key, now, #future)
    call('PEXPIRE', key, per + SLACK)
  end
  -- Members at or before now - per no longer count. They are removed only
  -- when something is admitted: a denial writes nothing but its repair.
  local live = '(' .. (now - per)
  local count = call('ZCOUNT', key, live, '+inf')
  if count + cost <= limit then
    return 1, limit - count - cost, per, 0, now, now + per
  end
  local newest = num(call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  local oldest_needed = call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
  local retry = num(oldest_needed[2]) + per - now
  return 0, max(0, limit - count), max(0, newest + per - now), max(1, retry)
end

-- concurrency keeps one sorted-set member per lease held, named by the
-- lease and scored by when it expires (per, the lease, after it was taken).
local function concurrency(key, now, limit, per, lease)
  -- Leases expiring later than one taken now would (this clock is behind
  -- the one that wrote them) expire one lease from now; written at once.
  local latest = now + per
  local ahead = call('ZRANGEBYSCORE', key, '(' .. latest, '+inf')
  if #ahead > 0 then
    for i = 1, #ahead, 1000 do
      local args = {}
      for j = i, min(i + 999, #ahead) do
        args[#args + 1] = latest
        args[#args + 1] = ahead[j]
      end
      call('ZADD', key, unpack(args))
    end
    call('PEXPIRE', key, per + SLACK)
  end
  local live = call('ZCOUNT', key, '(' .. now, '+inf')
  if live < limit then
    local state
    if lease ~= '' then state = lease end
    return 1, limit - live - 1, per, 0, state, latest
  end
  -- A slot frees when enough leases have expired to bring the count under
  -- the limit (a release may free one sooner, never later).
  local needed = call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', live - limit, 1)
  local newest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return 0, 0, num(newest[2]) - now, max(1, num(needed[2]) - now)
end

local function log_append(key, at, cost, now, idle)
  -- idle is at + per: what expired by at goes.
  call('ZREMRANGEBYSCORE', key, '-inf', at - (idle - at))
  log_add(key, at, cost)
  call('PEXPIRE', key, idle - now + SLACK)
end

-- The decision: a script calls it with its KEYS and ARGV, a Redis
-- Function with the keys and arguments of its FCALL.
local function decide(KEYS, ARGV)
  if not call then bind() end
  local now = now_ms(ARGV[1])
  local lease = ARGV[2]
  local n = #ARGV - 2
  local rotating = #KEYS > n

  -- Rotation: a bucket not yet under the new pepper starts from its state
  -- under the previous one, so a rotation neither resets nor doubles budgets.
  if rotating then
    for i = 1, n do
      if call('EXISTS', KEYS[i]) == 0 and call('EXISTS', KEYS[n + i]) == 1 then
        call('COPY', KEYS[n + i], KEYS[i])
      end
    end
  end

  reply[1] = now
  local all_allowed = true
  for i = 1, n do
    local algorithm, aligned, shadow, limit, per, burst, cost = sunpack(RULE, ARGV[2 + i])
    local key = KEYS[i]
    local allowed, remaining, reset, retry, state, idle, fix, fix_idle
    if algorithm == 3 then
      allowed, remaining, reset, retry, state, idle = sliding_log(key, now, cost, limit, per)
    elseif algorithm == 6 then
      allowed, remaining, reset, retry, state, idle = concurrency(key, now, limit, per, lease)
    else
      local value = call('GET', key)
      if not value then value = nil end
      if algorithm == 1 then
        allowed, remaining, reset, retry, state, idle, fix, fix_idle =
          gcra(value, now, cost, limit, per, burst)
      elseif algorithm == 2 then
        allowed, remaining, reset, retry, state, idle, fix, fix_idle =
          token_bucket(value, now, cost, limit, per, burst)
      elseif algorithm == 4 then
        allowed, remaining, reset, retry, state, idle, fix, fix_idle = sliding_window(value, now, cost, limit, per)
      else
        allowed, remaining, reset, retry, state, idle, fix, fix_idle =
          fixed_window(value, now, cost, limit, per, aligned)
      end
    end
    if allowed == 0 and shadow == 0 then all_allowed = false end
    local w = 6 * (i - 1)
    writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4] = state or false, idle, fix or false, fix_idle
    writes[w + 5], writes[w + 6] = algorithm, cost
    local r = 4 * i - 2
    reply[r], reply[r + 1], reply[r + 2], reply[r + 3] = allowed, remaining, reset, retry
  end

  for i = 1, n do
    local w = 6 * (i - 1)
    local state, idle, fix = writes[w + 1], writes[w + 2], writes[w + 3]
    if all_allowed and state then
      local algorithm, cost = writes[w + 5], writes[w + 6]
      if algorithm == 3 then
        log_append(KEYS[i], state, cost, now, idle)
      elseif algorithm == 6 then
        call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
        call('ZADD', KEYS[i], idle, state)
        call('PEXPIRE', KEYS[i], idle - now + SLACK)
      else
        call('SET', KEYS[i], state, 'PX', max(1, idle - now + SLACK))
      end
    elseif fix then
      -- Nothing consumed, but the repaired state is kept.
      call('SET', KEYS[i], fix, 'PX', max(1, writes[w + 4] - now + SLACK))
    end
  end

  local format = REPLY[n]
  if not format then
    format = '<' .. string.rep('d', 1 + 4 * n)
    REPLY[n] = format
  end
  return spack(format, unpack(reply, 1, 1 + 4 * n))
end
