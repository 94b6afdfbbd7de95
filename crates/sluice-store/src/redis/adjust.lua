-- sluice: change what rules hold after the fact, atomically, in one call:
-- a debit (a cost already spent, counted even past the limit: debt) or a
-- give-back (a settled reservation that cost less than its estimate),
-- once per settle marker. Follows decide.lua (its algorithms answer for
-- the state after the change) and common.lua.
--
-- KEYS[1..m]   the rules' keys (as the decision names them)
-- KEYS[m+1..2m] (only while rotating the pepper, see ARGV[7]) the same
--              keys under the previous pepper
-- KEYS[#KEYS]  (when ARGV[4] is not "") the settle marker, after them
-- ARGV[1], ARGV[2]  the rules and the header (see arguments in
--              common.lua); a rule's cost is the units to change
-- ARGV[3]      "D": debit; "P": no change (only the marker, and the
--              answer); otherwise the admission time (ms) of what is given
--              back
-- ARGV[4]      the marker's value ("": no marker), ARGV[5] its life (ms)
-- ARGV[6]      with a give-back: per rule, when its units would have
--              refilled (see give_back in common.lua), little-endian
--              doubles; "" or absent: not known
-- ARGV[7]      (only while rotating the pepper) per rule, its record's
--              name under the previous pepper (8 bytes each); the rules'
--              keys are then followed by the same under the previous
--              pepper (before the marker): a key not yet under the new
--              pepper starts from its state under the previous one, and a
--              record is found under either name, as decide.lua does
--
-- Returns a string of little-endian doubles: now, the marker's answer (0:
-- applied or no marker; 1: the same value was applied before, nothing
-- changed; 2: another value was, nothing changed), then per rule
-- remaining, reset_after_ms and retry_after_ms of a request of one unit
-- after the change (it would pass when retry is 0) and the units forgiven
-- beyond its max_debt.
--
-- Each debit is sluice-core's Rule::debit step for step: the state is
-- repaired first (as a decision repairs it), then charged, owing at most
-- max_debt. A key's expiry grows with what it owes.

-- The record of one rule, repaired as a decision would repair it.
local function repaired(key, algorithm, name, previous, now, limit, per, burst, aligned,
                        max_debt)
  local value = call('GET', key)
  local found, x, y, z = read_record(value, name, previous)
  local _, _, _, _, _, _, fixed = numbers_of(algorithm)(name, found, x, y, z, now, 1, limit, per,
    burst, aligned, max_debt)
  if fixed then
    x, y, z = sunpack('<ddd', fixed, 17)
  end
  return found, x, y, z
end

-- Charges cost units of one rule whose state is a few numbers; returns
-- the units forgiven. The twin of sluice-core's algorithm::debit.
local function debit_numbers(key, algorithm, name, previous, now, cost, limit, per, burst,
                             aligned, max_debt)
  local found, x, y, z = repaired(key, algorithm, name, previous, now, limit, per, burst,
    aligned, max_debt)
  -- A gcra or token_bucket record made now: its give-back mark is now.
  if not found then z = now end
  local forgiven = 0
  if algorithm == 1 then
    -- gcra: the TAT moves ahead of max(TAT, now), at most burst + max_debt
    -- intervals ahead of now.
    local charged = min(cost, burst + max_debt)
    local ms, frac = x, y
    if frac >= limit then
      local q = idiv(frac, limit)
      ms, frac = ms + q, frac - q * limit
    end
    if not (ms > now or (ms == now and frac > 0)) then ms, frac = now, 0 end
    local ahead = (ms - now) * limit + frac + charged * per
    local deepest = (burst + max_debt) * per
    local excess = 0
    if ahead > deepest then ahead, excess = deepest, ahead - deepest end
    local q = idiv(ahead, limit)
    ms, frac = now + q, ahead - q * limit
    forgiven = cost - charged + ceil_div(excess, per)
    local idle = ms
    if frac > 0 then idle = ms + 1 end
    write_record(key, name, idle, ms, frac, z, now)
  elseif algorithm == 2 then
    -- token_bucket: owing, it refills from a moment ahead of now.
    local capacity = burst * per
    local charged = min(cost, burst + max_debt)
    local held, owed = capacity, 0
    if found then
      -- Below zero while owing (refilling from a moment ahead of now).
      held = x + (now - y) * limit
      if held < 0 then held, owed = 0, -held end
      held = min(capacity, held)
    end
    local need = charged * per
    local tokens, last
    if owed == 0 and held >= need then
      tokens, last = held - need, now
      forgiven = cost - charged
    else
      owed = owed + need - held
      local deepest = max_debt * per
      local excess = 0
      if owed > deepest then owed, excess = deepest, owed - deepest end
      local ahead_ms = ceil_div(owed, limit)
      tokens, last = ahead_ms * limit - owed, now + ahead_ms
      forgiven = cost - charged + ceil_div(excess, per)
    end
    write_record(key, name, last + ceil_div(max(0, capacity - tokens), limit), tokens, last, z, now)
  elseif algorithm == 5 then
    -- fixed_window: the window of now counts it, owing beyond limit (a
    -- count of another rule read as spent).
    if y > limit + max_debt then y = limit end
    local start, count = window_of(x, y, now, limit, per, aligned)
    local counted = count + cost
    local kept = min(counted, max(limit + max_debt, count))
    forgiven = counted - kept
    write_record(key, name, window_idle(start, kept, limit, per), start, kept, 0, now)
  elseif algorithm == 7 then
    -- A window shared across regions (regions::Stored::debit): the window
    -- of now counts it, at most max_debt past this region's cap.
    local window = idiv(now, per) * per
    if not found then x, y, z = window, 0, 0 end
    local at
    local r = regions()
    at, y, z = r.shared_at(x, y, z, window, limit, per, max_debt)
    local counted = y + cost
    local kept = min(counted, max(max(0, limit + z) + max_debt, y))
    forgiven = counted - kept
    write_record(key, name, r.shared_idle(at, kept, z, limit, per), at, kept, z, now)
  elseif algorithm == 8 then
    -- A sliding_window shared across regions (regions::Stored::debit of a
    -- Slide): the window of now counts it, at most max_debt past what
    -- remains.
    local window = idiv(now, per) * per
    if not found then x, y, z = window, 0, 0 end
    local r = regions()
    x, y, z = r.slide_at(x, y, z, window, limit, per, max_debt)
    local most = idiv(max(0, r.slide_room(x, y, z, now, limit + max_debt, per)), per)
    local kept = min(cost, most)
    forgiven = cost - kept
    write_record(key, name, r.slide_idle(x, z + kept, limit, per), x, y, z + kept, now)
  elseif algorithm == 9 then
    -- A gcra or token_bucket shared across regions (regions::Stored::debit
    -- of a Bucket): its tokens of now count it, at most max_debt units
    -- below 0.
    local at, tokens, moved = 0, x, z
    if found and y < 0 then at = -y end
    local r = regions()
    local e = r.bucket_epoch(per)
    tokens, at, moved = r.bucket_at(tokens, at, moved, idiv(now, e) * e, limit, per, burst,
      max_debt)
    tokens, at = r.bucket_settled(tokens, at, moved, now, limit, burst)
    local kept = min(cost, idiv(max(0, tokens + max_debt * per), per))
    forgiven = cost - kept
    tokens = tokens - kept * per
    write_record(key, name, r.bucket_idle(tokens, at, moved, limit, per, burst, max_debt), tokens,
      -at, moved, now)
  else
    -- sliding_window: the current window counts it, owing beyond limit.
    local start = idiv(now, per) * per
    x, y, z = as_read(x, y, z, limit, per, max_debt)
    local p, c = moved(x, y, z, start, per, limit)
    local counted = c + cost
    local kept = min(counted, max(limit + max_debt, c))
    forgiven = counted - kept
    write_record(key, name, windows_idle(start, kept, limit, per), start, p, kept, now)
  end
  return forgiven
end

-- Charges cost units of a sliding_log rule as entries at now (repaired
-- first); returns the units forgiven.
local function debit_log(key, now, cost, limit, per, max_debt)
  sliding_log(key, now, 1, limit, per)
  local live = call('ZCOUNT', key, '(' .. (now - per), '+inf')
  local units = min(cost, max(0, limit + max_debt - live))
  if units > 0 then
    call('ZREMRANGEBYSCORE', key, '-inf', now - per)
    log_add(key, now, units)
    call('PEXPIRE', key, per + SLACK)
  end
  return cost - units
end

local function adjust(KEYS, ARGV)
  if not call then bind() end
  local rules, n, now = arguments(ARGV)
  local debit, nothing = ARGV[3] == 'D', ARGV[3] == 'P'
  local at = 0
  if not (debit or nothing) then at = num(ARGV[3]) end
  local marker = ARGV[4] or ''
  local wholes = ARGV[6] or ''
  local names_before = ARGV[7]
  if names_before then
    -- Rotation: a bucket not yet under the new pepper starts from its
    -- state under the previous one (decide.lua does the same).
    local m = #KEYS
    if marker ~= '' then m = m - 1 end
    adopt_previous(KEYS, m / 2)
  end
  local answer = 0
  if marker ~= '' then
    local key = KEYS[#KEYS]
    local before = call('GET', key)
    if before then
      answer = 2
      if before == marker then answer = 1 end
    else
      call('SET', key, marker, 'PX', num(ARGV[5]))
    end
  end
  local out = { now, answer }
  local pos = 1
  for i = 1, n do
    local algorithm, aligned, _, k, limit, per, burst, cost, max_debt, name, after =
      sunpack(RULE, rules, pos)
    pos = after
    local key = KEYS[k]
    local previous = names_before and sub(names_before, 8 * i - 7, 8 * i)
    local forgiven = 0
    if answer == 0 and cost > 0 and not nothing then
      if not debit then
        local whole = 0
        if wholes ~= '' then whole = sunpack('<d', wholes, 8 * i - 7) end
        give_back(key, algorithm, limit, per, burst, cost, name, at, now, '', whole, previous)
      elseif algorithm == 3 then
        forgiven = debit_log(key, now, cost, limit, per, max_debt)
      elseif algorithm ~= 6 then
        forgiven = debit_numbers(key, algorithm, name, previous, now, cost, limit, per, burst,
          aligned, max_debt)
      end
    end
    -- What a request of one unit would get now.
    local _, remaining, reset, retry
    if algorithm == 3 then
      _, remaining, reset, retry = sliding_log(key, now, 1, limit, per)
    elseif algorithm == 6 then
      _, remaining, reset, retry = concurrency(key, now, limit, per, '')
    else
      local found, x, y, z = read_record(call('GET', key), name, previous)
      local fixed
      _, remaining, reset, retry, _, _, fixed = numbers_of(algorithm)(name, found, x, y, z, now, 1,
        limit, per, burst, aligned, max_debt)
      if fixed then
        -- The repair is kept, as a decision keeps it.
        local _, idle, a, b, c = sunpack(RECORD, fixed)
        write_record(key, name, idle, a, b, c, now)
      end
    end
    local o = 4 * i - 1
    out[o], out[o + 1], out[o + 2], out[o + 3] = remaining, reset, retry, forgiven
  end
  return spack('<' .. string.rep('d', 2 + 4 * n), unpack(out))
end
