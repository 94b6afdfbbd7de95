-- sluice: a shared rule's part of the budget across regions, as the
-- region link reads and moves it (sluice-core's regions::Stored, step for
-- step; a differential test holds the two to identical answers). Follows
-- common.lua and decide.lua (records, shared_window).
--
-- KEYS[1]  the rule's group key (its record, as decisions read it)
-- KEYS[2]  the group's ledger: a hash, one field per rule (its record's
--          name), the value little-endian doubles: the window, the per,
--          the pool, the units wanted, then per region the total granted
--          to it, then per region the total heard from it, then per region
--          its last view of itself (cap, used, wanted, heard from this
--          region, when heard; when 0: none)
-- KEYS[3]  the units each region's totals added here, by region (a hash;
--          hear only)
-- KEYS[4]  the region's identity (hear only: see ARGV[16])
-- KEYS[5], KEYS[6]  (only while rotating the pepper) the group key and
--          the ledger under the previous pepper: a record or ledger found
--          only there is carried over, as decide.lua carries a group
-- ARGV[1]  the step: "note", "read", "grant" or "hear"
-- ARGV[2]  now in ms ("" for the server's clock)
-- ARGV[3]  the record's name (8 bytes); ARGV[4] the rule's per (ms);
-- ARGV[5]  how many regions; ARGV[6] the record's name under the previous
--          pepper ("" when not rotating); ARGV[7] this region's share of
--          the pool (what a record of an earlier window owes is read
--          against it, as a decision reads it)
-- then, by step:
--   note   ARGV[8] window, ARGV[9] pool, ARGV[10] units wanted; returns 1
--          (noted) or 0 (the window is over)
--   read   returns the ledger of the window of now as above, preceded by
--          the window, the units admitted and what moved here (a string
--          of doubles)
--   grant  ARGV[8] window, ARGV[9] to (a region, from 0), ARGV[10]
--          units; returns the new total granted to it, or -1 (does not
--          fit, or the window is over)
--   hear   ARGV[8] window, ARGV[9] pool, ARGV[10] from (a region, from
--          0), ARGV[11] the total it granted here, ARGV[12..15] its view
--          (cap, used, wanted, heard from here), ARGV[16] the identity the
--          shipper checked this region has; returns the units added, -1 (the
--          window is over here) or -2 (the identity changed: nothing done)
--
-- A record or ledger of another per whose window still runs (a reload
-- changed the rule's per; a peer not reloaded yet), or of a later window
-- (this Redis's clock is behind the one that wrote it), is left alone:
-- every step but read answers as if the window were over, and read as if
-- nothing were kept. Only a decision replaces it.

local VIEW = 5
local HEAD = 4

-- The ledger's layout for n regions (made once per n).
local LEDGER = {}
local function ledger_layout(n)
  local layout = LEDGER[n]
  if not layout then
    layout = '<' .. string.rep('d', HEAD + (2 + VIEW) * n)
    LEDGER[n] = layout
  end
  return layout
end

-- While rotating, a key found only under the previous pepper is carried
-- over (decide.lua does the same for a group).
local function carried(KEYS, k, previous)
  if previous ~= '' and KEYS[k + 4] and call('EXISTS', KEYS[k]) == 0
    and call('EXISTS', KEYS[k + 4]) == 1 then
    call('COPY', KEYS[k + 4], KEYS[k])
  end
end

-- The ledger as stored (a table { window, per, pool, wanted, given..,
-- heard.., views.. }), or nil; false when it is of another per and its
-- window still runs.
local function stored_ledger(KEYS, name, previous, per, n, now)
  local value = call('HGET', KEYS[2], name)
  if not value and previous ~= '' then value = call('HGET', KEYS[2], previous) end
  if not value or #value ~= 8 * (HEAD + (2 + VIEW) * n) then return nil end
  local l = { sunpack(ledger_layout(n), value) }
  l[#l] = nil -- struct.unpack's next position
  if l[2] ~= per and l[1] + l[2] > now then return false end
  return l
end

-- The ledger of window: as stored when it is of that window, else afresh.
local function ledger_at(l, window, per, n)
  if not l or l[1] ~= window or l[2] ~= per then
    l = { window, per, 0, 0 }
    for i = HEAD + 1, HEAD + (2 + VIEW) * n do l[i] = 0 end
  end
  return l
end

local function ledger_write(KEYS, name, l, n, now, per)
  call('HSET', KEYS[2], name, spack(ledger_layout(n), unpack(l, 1, HEAD + (2 + VIEW) * n)))
  local ends = l[1] + per - now + SLACK
  if call('PTTL', KEYS[2]) < ends then call('PEXPIRE', KEYS[2], ends) end
end

-- The record as the window reads it (regions::Record::at): count, moved;
-- false when it is of another per and its window still runs.
local function record_at(KEYS, name, previous, window, share, per, now)
  local value = call('GET', KEYS[1])
  local found = value and find_record(value, name)
  if not found and value and previous ~= '' then found = find_record(value, previous) end
  if not found then return 0, 0 end
  local idle, start, count, moved = sunpack('<dddd', value, found + 8)
  -- Written under this per, its idle time is a whole number of windows
  -- after its aligned start (more than one while it owes).
  local span = idle - start
  local ours = start % per == 0 and span % per == 0 and span >= per
  if (not ours and idle > now) or start > window then return false end
  local _
  _, count, moved = shared_at(start, count, moved, window, share, per)
  return count, moved
end

local function ledger(KEYS, ARGV)
  if not call then bind() end
  local step, now, name = ARGV[1], now_ms(ARGV[2]), ARGV[3]
  if step == 'hear' and call('GET', KEYS[4]) ~= ARGV[16] then return -2 end
  local per, n, previous, share = num(ARGV[4]), num(ARGV[5]), ARGV[6], num(ARGV[7])
  local window = idiv(now, per) * per
  carried(KEYS, 1, previous)
  carried(KEYS, 2, previous)
  local stored = stored_ledger(KEYS, name, previous, per, n, now)
  local count, moved = record_at(KEYS, name, previous, window, share, per, now)
  local foreign = stored == false or count == false
  if step == 'read' then
    if foreign then count, moved, stored = 0, 0, nil end
    local l = ledger_at(stored, window, per, n)
    return spack('<ddd', window, count, moved) .. spack(ledger_layout(n), unpack(l, 1, HEAD + (2 + VIEW) * n))
  end
  if num(ARGV[8]) ~= window or foreign then
    if step == 'note' then return 0 end
    return -1
  end
  local l = ledger_at(stored, window, per, n)
  if step == 'note' then
    l[3] = num(ARGV[9])
    l[4] = l[4] + num(ARGV[10])
    ledger_write(KEYS, name, l, n, now, per)
    return 1
  end
  if step == 'grant' then
    local to, units = num(ARGV[9]), num(ARGV[10])
    if to >= n or units < 1 or units > max(0, share + moved) - count then return -1 end
    local g = HEAD + 1 + to
    l[g] = l[g] + units
    moved = moved - units
    ledger_write(KEYS, name, l, n, now, per)
    write_record(KEYS[1], name, shared_idle(window, count, moved, share, per), window, count,
      moved, now)
    return l[g]
  end
  -- hear
  local from, total = num(ARGV[10]), num(ARGV[11])
  if from >= n then return -1 end
  l[3] = num(ARGV[9])
  local h, g = HEAD + 1 + n + from, HEAD + 1 + from
  local added = max(0, total - l[h])
  l[h] = l[h] + added
  -- The peer heard more from here than this region knows it granted: its
  -- ledger was lost (a flush); what the peer counts is granted again.
  local lost = max(0, num(ARGV[15]) - l[g])
  l[g] = l[g] + lost
  local v = HEAD + 1 + 2 * n + VIEW * from
  for i = 0, 3 do l[v + i] = num(ARGV[12 + i]) end
  l[v + 4] = now
  ledger_write(KEYS, name, l, n, now, per)
  moved = moved + added - lost
  write_record(KEYS[1], name, shared_idle(window, count, moved, share, per), window, count,
    moved, now)
  if added > 0 then call('HINCRBY', KEYS[3], from, added) end
  return added
end
