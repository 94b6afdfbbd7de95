-- sluice: decide every rule of one request, atomically, in one call.
--
-- The arithmetic is the same as sluice-core's algorithms, step for step, on
-- integers below 2^53 (exact in Lua's doubles); a differential test holds
-- the two to identical answers.
--
-- KEYS[1..m]          the decision's distinct keys: one per group of rules
--                     whose state is a few numbers (a record each in the
--                     group's value, see common.lua), one per rule whose
--                     state is a set (sliding_log, concurrency)
-- KEYS[m+1..2m]       (only while rotating the pepper) the same keys under
--                     the previous pepper
-- ARGV[1], ARGV[2]    the rules and the header (see arguments in
--                     common.lua); the lease is the one an admission
--                     takes of each concurrency rule ("": concurrency
--                     rules only check)
-- ARGV[3]             (only while rotating the pepper) per rule, in order,
--                     its record's name under the previous pepper (8 bytes
--                     each)
--
-- Returns a string of little-endian doubles: the admission time (ms) a
-- refund of this decision would name, then per rule remaining,
-- reset_after_ms and retry_after_ms (a rule admits when its retry is 0: a
-- denial's is at least 1); converting a string costs Redis a fraction of
-- what a table of integers does. Every rule is checked
-- first; only when every enforced rule admits is anything written, so a
-- denied request consumes nothing. A shadow rule never blocks the others
-- and consumes only when it admits. A group's key is read once and written
-- once, with every record of it that changed; its other records are kept
-- unless idle for SLACK ms (a rule removed from the configuration leaves
-- nothing behind). Every key written expires when its states are as good
-- as fresh, plus SLACK ms (a function's rounded up to 64 ms: see expiry in
-- common.lua).
--
-- A state stamped later than now (this node's clock is behind the one that
-- wrote it: a step back, a failover) is first re-dated to now, keeping
-- what was consumed (sluice-core's Rule::repair); the repair is written
-- even when the request is denied, so that it happens once and nobody
-- waits out the step.

local SLACK = 1000

-- The reply's layouts, by rule count (see layout_of).
local REPLY = {}

-- Reused by every call of a loaded library (one call runs at a time): a
-- table built afresh costs its allocation, growth and collection. A call
-- sets every slot it reads; slots per key are valid when stamped with the
-- call's number. Per rule i, for a rule whose state is a few numbers:
-- record[i] to write when every rule admits (or false) and idle[i] when it
-- goes idle, fix[i] the repaired record (or false) and fix_idle[i], at[i]
-- where its record was found (or false); for a set: record[i] its state
-- (or false), idle[i], fix[i] its algorithm and fix_idle[i] its cost.
-- key[i] is the index of its key, set[i] whether its state is a set.
local reply, values, read_in, rules_of, replaced, parts = {}, {}, {}, {}, {}, {}
local record, idle, fix, fix_idle, at, key, set = {}, {}, {}, {}, {}, {}, {}
local calls = 0

-- Each algorithm takes the rule's record name, whether its record was
-- found and the record's three numbers (0 when not), now, cost, limit,
-- per, burst, aligned and max_debt (those it uses), and returns allowed,
-- remaining, reset, retry, then when it admits the record to write and
-- when it goes idle (nil otherwise), then when the stored state had to be
-- repaired the repaired record and when it goes idle (written when nothing
-- else is; nil otherwise). The divisions of the common path are idiv
-- written out (a call costs more than its arithmetic).

local function gcra(name, found, ms, frac, given, now, cost, limit, per, burst, _, max_debt)
  -- A bucket without a record was whole: no give-back before now can
  -- count on where its admission's units sat (see give_back).
  if not found then given = now end
  if frac >= limit then
    local q = idiv(frac, limit)
    ms, frac = ms + q, frac - q * limit
  end
  local capacity = burst * per
  local fixed, fixed_idle
  if ms > now then
    -- Ahead by more than the deepest debt: the clock stepped back.
    local deepest = capacity + max_debt * per
    local ahead_ms = ms - now
    local q = deepest / limit
    q = q - q % 1
    if ahead_ms > q + 1 or ahead_ms * limit + frac > deepest then
      q = capacity / limit
      q = q - q % 1
      ms, frac = now + q, capacity - q * limit
      fixed_idle = ms
      if frac > 0 then fixed_idle = ms + 1 end
      fixed = spack(RECORD, name, fixed_idle, ms, frac, given)
    end
  end
  local bms, bfrac = now, 0
  if ms > now or (ms == now and frac > 0) then
    bms, bfrac = ms, frac
  end
  local total = bfrac + cost * per
  local q = total / limit
  q = q - q % 1
  local nms, nfrac = bms + q, total - q * limit
  local next_ahead = (nms - now) * limit + nfrac
  local nround = 0
  if nfrac > 0 then nround = 1 end
  if next_ahead <= capacity then
    local left = capacity - next_ahead
    local r = left / per
    r = r - r % 1
    return 1, r, nms - now + nround, 0,
      spack(RECORD, name, nms + nround, nms, nfrac, given), nms + nround, fixed, fixed_idle
  end
  local base_ahead = (bms - now) * limit + bfrac
  local remaining = 0
  if capacity > base_ahead then remaining = idiv(capacity - base_ahead, per) end
  local bround = 0
  if bfrac > 0 then bround = 1 end
  return 0, remaining, bms - now + bround, max(1, ceil_div(next_ahead - capacity, limit)),
    nil, nil, fixed, fixed_idle
end

local function token_bucket(name, found, tokens, at, given, now, cost, limit, per, burst, _, max_debt)
  if not found then given = now end
  local capacity = burst * per
  local available, last = capacity, now
  local fixed, fixed_idle
  if found then
    if at > now and at - now > ceil_div(max_debt * per, limit) then
      -- Refilled "later" than the deepest debt allows (the clock stepped
      -- back): the same tokens, refilling from now.
      at = now
      fixed_idle = now + ceil_div(max(0, capacity - tokens), limit)
      fixed = spack(RECORD, name, fixed_idle, tokens, now, given)
    end
    -- Below zero while owing (refilling from a moment ahead of now).
    available = min(capacity, tokens + (now - at) * limit)
  end
  local need = cost * per
  if available >= need then
    local left = available - need
    local full_in = ceil_div(capacity - left, limit)
    return 1, idiv(left, per), full_in, 0,
      spack(RECORD, name, last + full_in, left, last, given), last + full_in, fixed, fixed_idle
  end
  return 0, idiv(max(0, available), per), ceil_div(capacity - available, limit),
    max(1, ceil_div(need - available, limit)), nil, nil, fixed, fixed_idle
end

-- The window now counts in (sluice-core's fixed_window::current): the
-- stored one, or the next one opened owing what the stored one carries
-- (each window that passed repays limit).
local function window_of(start, count, now, limit, per, aligned)
  local passed = 0
  if now > start then passed = idiv(now - start, per) end
  local owed = max(0, count - passed * limit)
  if aligned == 1 then
    local current = idiv(now, per) * per
    if start ~= current then return current, owed end
    return start, count
  end
  if count == 0 or (passed >= 1 and owed == 0) then return now, 0 end
  if passed >= 1 then return start + passed * per, owed end
  return start, count
end

-- When a window that counts count (perhaps owing) is idle: once the
-- windows after it have repaid what it owed.
local function window_idle(start, count, limit, per)
  return start + max(1, ceil_div(count, limit)) * per
end

local function fixed_window(name, found, start, count, _, now, cost, limit, per, _, aligned,
                            max_debt)
  local fixed, fixed_idle
  local current = now
  if aligned == 1 then current = idiv(now, per) * per end
  if found and start > current then
    -- A window that starts "later": the window of now, same count.
    start = current
    fixed_idle = window_idle(start, count, limit, per)
    fixed = spack(RECORD, name, fixed_idle, start, count, 0)
  end
  -- Counting more than the rule can owe: written under another rule,
  -- read as spent (sluice-core's fixed_window::current), never written so.
  if count > limit + max_debt then count = limit end
  start, count = window_of(start, count, now, limit, per, aligned)
  local ends_in = max(1, start + per - now)
  if count + cost <= limit then
    return 1, limit - count - cost, ends_in, 0,
      spack(RECORD, name, start + per, start, count + cost, 0), start + per, fixed, fixed_idle
  end
  -- Owing, the request waits for the window whose carried debt leaves
  -- room for it; full once nothing is carried.
  local waits = max(1, ceil_div(count + cost - limit, limit))
  local full = max(1, ceil_div(count, limit))
  return 0, max(0, limit - count), ends_in + (full - 1) * per,
    ends_in + (waits - 1) * per, nil, nil, fixed, fixed_idle
end

-- The counts (prev, cur) as of the window starting at start
-- (sluice-core's sliding_window::moved): each window that passed repays
-- limit of what was owed.
local function moved(wstart, prev, cur, start, per, limit)
  if wstart == start then return prev, cur end
  local passed = idiv(start - wstart, per)
  return min(limit, max(0, cur - (passed - 1) * limit)), max(0, cur - passed * limit)
end

-- Windows holding what the rule can never hold, or starting off its per,
-- were written under another rule: read as spent, never written so
-- (sluice-core's sliding_window::as_read; a negative count, which only a
-- shared window writes, as the store crate's redis::inspect::decode reads
-- it).
local function as_read(wstart, prev, cur, limit, per, max_debt)
  if cur < 0 or prev < 0 then
    -- A shared window's (what moved to its region counted apart), read
    -- after a reload made the rule local: spent.
    return wstart - wstart % per, min(max(0, prev), limit), limit
  end
  if cur > limit + max_debt or prev > limit or wstart % per ~= 0 then
    return wstart - wstart % per, min(prev, limit), min(cur, limit)
  end
  return wstart, prev, cur
end

-- When windows whose current one counts cur (perhaps owing) are idle.
local function windows_idle(start, cur, limit, per)
  return start + max(2, 1 + ceil_div(cur, limit)) * per
end

local function sliding_window(name, found, wstart, prev, cur, now, cost, limit, per, _, _,
                              max_debt)
  local start = idiv(now, per) * per
  local fixed, fixed_idle
  if found and wstart > start then
    -- Windows that start "later": moved to the window of now, same counts.
    wstart = start
    fixed_idle = windows_idle(start, cur, limit, per)
    fixed = spack(RECORD, name, fixed_idle, start, prev, cur)
  end
  wstart, prev, cur = as_read(wstart, prev, cur, limit, per, max_debt)
  local p, c = moved(wstart, prev, cur, start, per, limit)
  local elapsed = now - start
  local capacity = limit * per
  local weighted = p * (per - elapsed) + c * per
  local need = cost * per
  if weighted + need <= capacity then
    return 1, idiv(capacity - weighted - need, per), start + 2 * per - now, 0,
      spack(RECORD, name, start + 2 * per, start, p, c + cost), start + 2 * per, fixed, fixed_idle
  end
  local remaining = 0
  if capacity > weighted then remaining = idiv(capacity - weighted, per) end
  local reset = start + (1 + ceil_div(c, limit)) * per - now
  local retry
  if c + cost <= limit and p > 0 then
    local at = per - min(idiv((limit - c - cost) * per, p), per)
    if at < per then retry = at - elapsed end
  end
  if not retry then
    -- In a later window j, the counts moved on: from the first whose
    -- carried debt leaves room for the cost, the first moment the
    -- previous window's weight allows it (sliding_window::retry_after).
    local j = max(1, ceil_div(max(0, c + cost - limit), limit))
    while not retry do
      local pj, cj = min(limit, max(0, c - (j - 1) * limit)), max(0, c - j * limit)
      local at = 0
      if pj > 0 then at = per - min(idiv((limit - cj - cost) * per, pj), per) end
      if at < per then retry = j * per - elapsed + at end
      j = j + 1
    end
  end
  return 0, remaining, reset, max(1, retry), nil, nil, fixed, fixed_idle
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

-- The algorithms whose state is a few numbers, by code; and a record's
-- numbers when there is none.
local NUMBERS = { gcra, token_bucket, nil, sliding_window, fixed_window }

-- The algorithm of code k whose state is a few numbers: the rules shared
-- across regions (7 and up) from regions(), made on first use (the hot
-- paths below write this out).
local function numbers_of(k)
  return NUMBERS[k] or (k >= 7 and regions()[k]) or nil
end
local NONE = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0' -- RECORD_BYTES zeros, a constant

-- Appends to parts (or list; np so far, the latest idle idle_at) the
-- records of value not replaced by this write (token in replaced, or in
-- marks) and not idle for SLACK ms; returns the new np and idle_at.
local function carry(value, token, np, idle_at, now, list, marks)
  list, marks = list or parts, marks or replaced
  for from = 1, #value - RECORD_BYTES + 1, RECORD_BYTES do
    if marks[from] ~= token then
      local t = sunpack('<d', value, from + 8)
      if t + SLACK > now then
        np = np + 1
        list[np] = sub(value, from, from + RECORD_BYTES - 1)
        if t > idle_at then idle_at = t end
      end
    end
  end
  return np, idle_at
end

-- The records a group's write would hold if the decision is denied, and
-- the positions they replace (see decide's one-key path).
local fixes, fixed_at = {}, {}

-- Writes group key k's records that changed (its rules from first on),
-- keeping its other records.
local function write_group(KEYS, k, first, n, now, all_allowed)
  local token = calls * 65536 + k
  local np, idle_at = 0, 0
  for i = first, n do
    if key[i] == k and not set[i] then
      local r, t = record[i], idle[i]
      if not (all_allowed and r) then r, t = fix[i], fix_idle[i] end
      if r then
        np = np + 1
        parts[np] = r
        if t > idle_at then idle_at = t end
        if at[i] then replaced[at[i]] = token end
      end
    end
  end
  if np == 0 then return end
  if values[k] then np, idle_at = carry(values[k], token, np, idle_at, now) end
  call('SET', KEYS[k], concat(parts, '', 1, np), 'PX', expiry(idle_at - now + SLACK))
end

-- Where name's record is in value (or previous's while rotating), and its
-- numbers (zeros when there is none).
local function read_record(value, name, previous)
  local found = value and find(value, name, 1, true)
  if found and found % RECORD_BYTES ~= 1 then found = find_record(value, name) end
  if previous and value and not found then found = find_record(value, previous) end
  return found, sunpack('<ddd', found and value or NONE, (found or 1) + 16)
end

-- A rule's record written into its group's value (appended when it has
-- none), the key expiring no sooner than it did nor than idle + SLACK.
local function write_record(key, name, idle, a, b, c, now)
  local value = call('GET', key)
  local record = spack(RECORD, name, idle, a, b, c)
  local pos = value and find_record(value, name)
  if pos then
    value = sub(value, 1, pos - 1) .. record .. sub(value, pos + RECORD_BYTES)
  else
    value = (value or '') .. record
  end
  local ttl = call('PTTL', key)
  call('SET', key, value, 'PX', max(ttl, idle - now + SLACK))
end

-- The reply's layout for n rules (made once per n).
local function layout_of(n)
  local layout = REPLY[n]
  if not layout then
    layout = '<' .. string.rep('d', 1 + 3 * n)
    REPLY[n] = layout
  end
  return layout
end

-- The decision: a script calls it with its KEYS and ARGV, a Redis
-- Function with the keys and arguments of its FCALL.
local function decide(KEYS, ARGV)
  if not call then bind() end
  calls = calls + 1
  local rules, n, now, lease = arguments(ARGV)
  local names_before = ARGV[3]
  local rotating = names_before ~= nil
  if rotating then
    -- Rotation: a bucket not yet under the new pepper starts from its
    -- state under the previous one, so a rotation neither resets nor
    -- doubles budgets (records are found under either name).
    adopt_previous(KEYS, #KEYS / 2)
  end

  if n == 1 then
    -- One rule whose state is a few numbers: no bookkeeping, its record
    -- written as soon as it is decided.
    local algorithm, aligned, _, _, limit, per, burst, cost, max_debt, name = sunpack(RULE, rules)
    local decide_numbers = NUMBERS[algorithm] or (algorithm >= 7 and regions()[algorithm])
    if decide_numbers then
      local value = call('GET', KEYS[1])
      -- read_record(value, name, names_before), written out.
      local found = value and find(value, name, 1, true)
      if found and found % RECORD_BYTES ~= 1 then found = find_record(value, name) end
      if rotating and value and not found then found = find_record(value, names_before) end
      local x, y, z = sunpack('<ddd', found and value or NONE, (found or 1) + 16)
      local _, remaining, reset, retry, r, t, f, ft =
        decide_numbers(name, found, x, y, z, now, cost, limit, per, burst, aligned, max_debt)
      if not r then r, t = f, ft end
      if r then
        if value and not (found == 1 and #value == RECORD_BYTES) then
          -- Other rules' records share the key: kept.
          local token = -calls
          if found then replaced[found] = token end
          parts[1] = r
          local np
          np, t = carry(value, token, 1, t, now)
          r = concat(parts, '', 1, np)
        end
        call('SET', KEYS[1], r, 'PX', expiry(t - now + SLACK))
      end
      return spack('<dddd', now, remaining, reset, retry)
    end
  end

  if n > 1 and #KEYS == 1 and not rotating then
    -- Several rules, one key (a set needs a key of its own, so they are
    -- all rules of one group): decided in one pass, the records to write
    -- gathered as they come, both if every rule admits (parts) and if not
    -- (fixes: only repairs), then one write.
    local value = call('GET', KEYS[1])
    local token = -calls
    local all_allowed = true
    local np, nf, idle_at, fix_idle_at, kept = 0, 0, 0, 0, 0
    local pos = 1
    -- The tables the loop writes, as locals (an upvalue costs a step more).
    local reply, parts, replaced = reply, parts, replaced
    for i = 1, n do
      local algorithm, aligned, shadow, _, limit, per, burst, cost, max_debt, name, after =
        sunpack(RULE, rules, pos)
      pos = after
      -- read_record(value, name), written out (not rotating).
      local found = value and find(value, name, 1, true)
      if found and found % RECORD_BYTES ~= 1 then found = find_record(value, name) end
      local x, y, z = sunpack('<ddd', found and value or NONE, (found or 1) + 16)
      local allowed, remaining, reset, retry, r, t, f, ft =
        (NUMBERS[algorithm] or regions()[algorithm])(name, found, x, y, z, now, cost, limit, per,
          burst, aligned, max_debt)
      local o = 3 * i - 1
      reply[o], reply[o + 1], reply[o + 2] = remaining, reset, retry
      if allowed == 0 and shadow == 0 then all_allowed = false end
      if f then
        nf = nf + 1
        fixes[nf] = f
        if ft > fix_idle_at then fix_idle_at = ft end
        if found then fixed_at[found] = token end
        if not r then r, t = f, ft end
      end
      if r then
        np = np + 1
        parts[np] = r
        if t > idle_at then idle_at = t end
        if found then
          replaced[found] = token
          kept = kept + 1
        end
      end
    end
    if not all_allowed then
      np, idle_at = nf, fix_idle_at
    end
    if np > 0 then
      local list, marks = parts, replaced
      if not all_allowed then list, marks = fixes, fixed_at end
      -- The records of other rules are kept (none to keep when this
      -- write replaces every record of the value).
      if value and not (all_allowed and kept * RECORD_BYTES == #value) then
        np, idle_at = carry(value, token, np, idle_at, now, list, marks)
      end
      call('SET', KEYS[1], concat(list, '', 1, np), 'PX', expiry(idle_at - now + SLACK))
    end
    reply[1] = now
    return spack(REPLY[n] or layout_of(n), unpack(reply, 1, 1 + 3 * n))
  end

  local all_allowed = true
  local pos = 1
  for i = 1, n do
    local algorithm, aligned, shadow, k, limit, per, burst, cost, max_debt, name, after =
      sunpack(RULE, rules, pos)
    pos = after
    local previous = rotating and sub(names_before, 8 * i - 7, 8 * i)
    local decide_numbers = NUMBERS[algorithm] or (algorithm >= 7 and regions()[algorithm])
    local o = 3 * i - 1
    if decide_numbers then
      local value
      if read_in[k] ~= calls then
        read_in[k], rules_of[k] = calls, 1
        value = call('GET', KEYS[k])
        values[k] = value
      else
        rules_of[k] = rules_of[k] + 1
        value = values[k]
      end
      local found, x, y, z = read_record(value, name, previous)
      local allowed, remaining, reset, retry, r, t, f, ft =
        decide_numbers(name, found, x, y, z, now, cost, limit, per, burst, aligned, max_debt)
      record[i], idle[i], fix[i], fix_idle[i], at[i], key[i], set[i] =
        r or false, t, f or false, ft, found, k, false
      reply[o], reply[o + 1], reply[o + 2] = remaining, reset, retry
      if allowed == 0 and shadow == 0 then all_allowed = false end
    else
      local allowed, remaining, reset, retry, state, until_ms
      if algorithm == 3 then
        allowed, remaining, reset, retry, state, until_ms = sliding_log(KEYS[k], now, cost, limit, per)
      else
        allowed, remaining, reset, retry, state, until_ms = concurrency(KEYS[k], now, limit, per, lease)
      end
      record[i], idle[i], fix[i], fix_idle[i], key[i], set[i] =
        state or false, until_ms, algorithm, cost, k, true
      reply[o], reply[o + 1], reply[o + 2] = remaining, reset, retry
      if allowed == 0 and shadow == 0 then all_allowed = false end
    end
  end

  for i = 1, n do
    local k = key[i]
    if set[i] then
      local state = record[i]
      if all_allowed and state then
        if fix[i] == 3 then
          log_append(KEYS[k], state, fix_idle[i], now, idle[i])
        else
          call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now)
          call('ZADD', KEYS[k], idle[i], state)
          call('PEXPIRE', KEYS[k], idle[i] - now + SLACK)
        end
      end
    elseif read_in[k] == calls then
      -- The group's first rule: the group is written once.
      read_in[k] = 0
      local value = values[k]
      if rules_of[k] == 1 and (not value or (at[i] == 1 and #value == RECORD_BYTES)) then
        -- Its only rule, alone in the value: the record is the value.
        local r, t = record[i], idle[i]
        if not (all_allowed and r) then r, t = fix[i], fix_idle[i] end
        if r then call('SET', KEYS[k], r, 'PX', expiry(t - now + SLACK)) end
      else
        write_group(KEYS, k, i, n, now, all_allowed)
      end
    end
  end

  reply[1] = now
  return spack(layout_of(n), unpack(reply, 1, 1 + 3 * n))
end
