-- sluice: a shared rule's part of the budget across regions, as the
-- region link reads and moves it (sluice-core's regions::Stored, step for
-- step; a differential test holds the two to identical answers). Follows
-- common.lua and decide.lua (records, shared_window).
--
-- KEYS[1]  the rule's group key (its record, as decisions read it)
-- KEYS[2]  the group's ledger: a hash, one field per rule (its record's
--          name), the value little-endian doubles: the window, the pool,
--          the units wanted, then per region the total granted to it, then
--          per region the total heard from it, then per region its last
--          view of itself (cap, used, wanted, heard from this region, when
--          heard; when 0: none)
-- ARGV[1]  the step: "note", "read", "grant" or "hear"
-- ARGV[2]  now in ms ("" for the server's clock)
-- ARGV[3]  the record's name (8 bytes); ARGV[4] the rule's per (ms);
-- ARGV[5]  how many regions
-- then, by step:
--   note   ARGV[6] window, ARGV[7] pool, ARGV[8] units wanted; returns 1
--          (noted) or 0 (the window is over)
--   read   returns the ledger of the window of now as above, preceded by
--          the window, the units admitted and what moved here (a string
--          of doubles)
--   grant  ARGV[6] window, ARGV[7] share, ARGV[8] to (a region, from 0),
--          ARGV[9] units; returns the new total granted to it, or -1
--          (does not fit, or the window is over)
--   hear   ARGV[6] window, ARGV[7] pool, ARGV[8] from (a region, from 0),
--          ARGV[9] the total it granted here, ARGV[10..13] its view (cap,
--          used, wanted, heard from here); returns the units added, or -1
--          (the window is over here)

local VIEW = 5

-- The ledger's layout for n regions (made once per n).
local LEDGER = {}
local function ledger_layout(n)
  local layout = LEDGER[n]
  if not layout then
    layout = '<' .. string.rep('d', 3 + (2 + VIEW) * n)
    LEDGER[n] = layout
  end
  return layout
end

-- The ledger of window as a table { window, pool, wanted, given..,
-- heard.., views.. }: as stored when it is of that window, else afresh.
local function ledger_of(KEYS, name, window, n)
  local value = call('HGET', KEYS[2], name)
  local l
  if value and #value == 8 * (3 + (2 + VIEW) * n) then
    l = { sunpack(ledger_layout(n), value) }
    l[#l] = nil -- struct.unpack's next position
  end
  if not l or l[1] ~= window then
    l = { window, 0, 0 }
    for i = 4, 3 + (2 + VIEW) * n do l[i] = 0 end
  end
  return l
end

local function ledger_write(KEYS, name, l, n, now, per)
  call('HSET', KEYS[2], name, spack(ledger_layout(n), unpack(l, 1, 3 + (2 + VIEW) * n)))
  local ends = l[1] + per - now + SLACK
  if call('PTTL', KEYS[2]) < ends then call('PEXPIRE', KEYS[2], ends) end
end

-- The record as the window reads it (regions::Record::at).
local function record_at(KEYS, name, window)
  local found, start, count, moved = read_record(call('GET', KEYS[1]), name)
  if not found or start < window then return 0, 0 end
  if start > window then return count, min(moved, 0) end
  return count, moved
end

local function ledger(KEYS, ARGV)
  if not call then bind() end
  local step, now, name = ARGV[1], now_ms(ARGV[2]), ARGV[3]
  local per, n = num(ARGV[4]), num(ARGV[5])
  local window = idiv(now, per) * per
  if step == 'read' then
    local count, moved = record_at(KEYS, name, window)
    local l = ledger_of(KEYS, name, window, n)
    return spack('<ddd', window, count, moved) .. spack(ledger_layout(n), unpack(l, 1, 3 + (2 + VIEW) * n))
  end
  if num(ARGV[6]) ~= window then
    if step == 'note' then return 0 end
    return -1
  end
  local l = ledger_of(KEYS, name, window, n)
  if step == 'note' then
    l[2] = num(ARGV[7])
    l[3] = l[3] + num(ARGV[8])
    ledger_write(KEYS, name, l, n, now, per)
    return 1
  end
  local count, moved = record_at(KEYS, name, window)
  if step == 'grant' then
    local share, to, units = num(ARGV[7]), num(ARGV[8]), num(ARGV[9])
    if to >= n or units < 1 or units > max(0, share + moved) - count then return -1 end
    local g = 4 + to
    l[g] = l[g] + units
    moved = moved - units
    ledger_write(KEYS, name, l, n, now, per)
    write_record(KEYS[1], name, window + per, window, count, moved, now)
    return l[g]
  end
  -- hear
  local from, total = num(ARGV[8]), num(ARGV[9])
  if from >= n then return -1 end
  l[2] = num(ARGV[7])
  local h, g = 4 + n + from, 4 + from
  local added = max(0, total - l[h])
  l[h] = l[h] + added
  -- The peer heard more from here than this region knows it granted: its
  -- ledger was lost (a flush); what the peer counts is granted again.
  local lost = max(0, num(ARGV[13]) - l[g])
  l[g] = l[g] + lost
  local v = 4 + 2 * n + VIEW * from
  for i = 0, 3 do l[v + i] = num(ARGV[10 + i]) end
  l[v + 4] = now
  ledger_write(KEYS, name, l, n, now, per)
  write_record(KEYS[1], name, window + per, window, count, moved + added - lost, now)
  return added
end
