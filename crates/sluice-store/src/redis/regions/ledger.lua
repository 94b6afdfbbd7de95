-- sluice: a shared rule's part of the budget across regions, as the
-- region link reads and moves it (sluice-core's regions::Stored, step for
-- step; a differential test holds the two to identical answers). Follows
-- common.lua, regions/shared.lua (shared_at, slide_at, slide_room,
-- slide_idle) and decide.lua (records).
--
-- KEYS[1]  the rule's group key (its record, as decisions read it)
-- KEYS[2]  the group's ledger: a hash, one field per rule (its record's
--          name), the value little-endian doubles: the window, the per,
--          the pool, the units wanted, then per region the total granted
--          to it, then per region the total heard from it, then per region
--          its last view of itself (cap, used, wanted, heard from this
--          region, when heard; when 0: none); and of a bucket, beside it
--          under the name and "a", its recent demand "W:A:B": the units A
--          asked in the second starting at W and B in the one before (regions::stored::Demand: its epoch spans several
--          windows, and its demand is the latest's)
-- KEYS[3], KEYS[4]  (only while rotating the pepper: ARGV[6] is not
--          empty) the group key and the ledger under the previous pepper:
--          a record or ledger found only there is carried over, as
--          decide.lua carries a group
-- then, on one Redis node only (on a cluster they are in another slot,
-- and the link does without them: see ship.rs):
--   the units each region's totals added here, by region (a hash; hear
--          only)
--   the region's identity (hear only: see ARGV[17])
-- ARGV[1]  the step: "note", "read", "grant" or "hear"
-- ARGV[2]  now in ms ("" for the server's clock)
-- ARGV[3]  the record's name (8 bytes); ARGV[4] the rule's per (ms);
-- ARGV[5]  how many regions; ARGV[6] the record's name under the previous
--          pepper ("" when not rotating); ARGV[7] this region's share of
--          the pool (what a record of an earlier window owes is read
--          against it, as a decision reads it); ARGV[8] the rule's
--          algorithm, "7" a fixed_window (its record's numbers: start,
--          count, moved; shared_window in decide.lua), "8" a
--          sliding_window (start, carried, net; shared_sliding) or "9" a
--          gcra or token_bucket (tokens, -at, moved; shared_bucket), a
--          colon and its max_debt (a record of an earlier window is moved
--          on with it, as a decision moves it), and for "9" a colon and
--          its fill (burst x per / pool, as the decision's burst). A
--          bucket's window is its epoch (bucket_epoch), its share and
--          grants a rate in units per per
-- then, by step:
--   note   ARGV[9] window, ARGV[10] pool, ARGV[11] units wanted; returns 1
--          (noted) or 0 (the window is over)
--   read   returns the ledger of the window of now as above (a bucket's
--          units wanted those of the per-long window of now), preceded by
--          the window, the units admitted (of a sliding_window, with
--          what the previous window still weighs, rounded up) and what
--          moved here (0 for a sliding_window: its units admitted count
--          it already) (a string of doubles); a part that used anything
--          and has no ledger of the window is given one (see hear)
--   grant  ARGV[9] window, ARGV[10] to (a region, from 0), ARGV[11]
--          units; returns the new total granted to it, or -1 (does not
--          fit, or the window is over)
--   hear   ARGV[9] window, ARGV[10] pool, ARGV[11] from (a region, from
--          0), ARGV[12] the total it granted here, ARGV[13..16] its view
--          (cap, used, wanted, heard from here), ARGV[17] the identity the
--          shipper checked this region has, ARGV[18] what it last heard
--          this region used in the window; returns the units added, -1 (the
--          window is over here) or -2 (the identity changed: nothing done)
--
-- A record or ledger of another per whose window still runs (a reload
-- changed the rule's per; a peer not reloaded yet), or of a later window
-- (this Redis's clock is behind the one that wrote it), is left alone:
-- every step but read answers as if the window were over, and read as if
-- nothing were kept. Only a decision replaces it.

-- The shared rules' functions (the link's script makes them once a call).
local lib = regions()
local shared_at, shared_idle, slide_at, slide_idle, slide_room = lib.shared_at, lib.shared_idle,
  lib.slide_at, lib.slide_idle, lib.slide_room
local bucket_epoch, bucket_capacity, bucket_settled, bucket_at, bucket_idle = lib.bucket_epoch,
  lib.bucket_capacity, lib.bucket_settled, lib.bucket_at, lib.bucket_idle

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
  if previous ~= '' and KEYS[k + 2] and call('EXISTS', KEYS[k]) == 0
    and call('EXISTS', KEYS[k + 2]) == 1 then
    call('COPY', KEYS[k + 2], KEYS[k])
  end
end

-- The span a ledger of a rule of per counts in: the window; a bucket's
-- epoch (regions::SharedRecord::period).
local function period_of(per, bucket)
  if bucket then return bucket_epoch(per) end
  return per
end

-- The ledger as stored (a table { window, per, pool, wanted, given..,
-- heard.., views.. }), or nil; false when it is of another per and its
-- window still runs.
local function stored_ledger(KEYS, name, previous, per, n, now, bucket)
  local value = call('HGET', KEYS[2], name)
  if not value and previous ~= '' then value = call('HGET', KEYS[2], previous) end
  if not value or #value ~= 8 * (HEAD + (2 + VIEW) * n) then return nil end
  local l = { sunpack(ledger_layout(n), value) }
  l[#l] = nil -- struct.unpack's next position
  if l[2] ~= per and l[1] + period_of(l[2], bucket) > now then return false end
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

-- A bucket's recent demand (regions::stored::Demand): its window, the
-- units asked in it and in the one before, as stored (0s when not).
local MOST_ASKED = 2 ^ 40
local function demand_of(KEYS, name)
  local w, a, b = string.match(call('HGET', KEYS[2], name .. 'a') or '', '^(%d+):(%d+):(%d+)$')
  return num(w or 0), num(a or 0), num(b or 0)
end

-- With units asked at now (Demand::noted), in spans of a second.
local function noted(w, a, b, now, units)
  local per = 1000
  local window = idiv(now, per) * per
  units = min(units, MOST_ASKED)
  if w == window then return w, min(a + units, MOST_ASKED), b end
  if w + per == window then return window, units, a end
  return window, units, 0
end

-- The demand at now: the span of now's, and the one before weighed in
-- 1024ths by how much of it still falls within a span of now
-- (Demand::at).
local function demand(w, a, b, now)
  local per = 1000
  local window = idiv(now, per) * per
  local weight = idiv((per - (now - window)) * 1024, per)
  if w == window then return idiv(b * weight, 1024) + a end
  if w + per == window then return idiv(a * weight, 1024) end
  return 0
end

local function ledger_write(KEYS, name, l, n, now, span)
  call('HSET', KEYS[2], name, spack(ledger_layout(n), unpack(l, 1, HEAD + (2 + VIEW) * n)))
  local ends = l[1] + span - now + SLACK
  if call('PTTL', KEYS[2]) < ends then call('PEXPIRE', KEYS[2], ends) end
end

-- The record as the window reads it (regions::SharedRecord::at): its two numbers
-- after its start (count and moved; carried and net for a sliding
-- window; a bucket's three: tokens, at, moved); false when it is of
-- another per and its window still runs.
local function record_at(KEYS, name, previous, window, share, per, now, kind, max_debt, fill)
  local value = call('GET', KEYS[1])
  local found = value and find_record(value, name)
  if not found and value and previous ~= '' then found = find_record(value, previous) end
  if kind == '9' then
    local tokens, at, moved = 0, 0, 0
    if found then
      local idle, x, y, z = sunpack('<dddd', value, found + 8)
      -- Another algorithm's record still running, or of a later epoch.
      if y < 0 then
        if idiv(-y, bucket_epoch(per)) * bucket_epoch(per) > window then return false end
        tokens, at, moved = x, -y, z
      elseif idle > now then
        return false
      end
    end
    return bucket_at(tokens, at, moved, window, share, per, fill, max_debt)
  end
  local sliding = kind == '8'
  if not found then return 0, 0 end
  local idle, start, a, b = sunpack('<dddd', value, found + 8)
  -- Written under this per, its idle time is a whole number of windows
  -- after its aligned start (at least two for a sliding window, more
  -- while it owes).
  local span = idle - start
  local least = per
  if sliding then least = 2 * per end
  local ours = start % per == 0 and span % per == 0 and span >= least
  if (not ours and idle > now) or start > window then return false end
  local _
  if sliding then
    _, a, b = slide_at(start, a, b, window, share, per, max_debt)
  else
    _, a, b = shared_at(start, a, b, window, share, per, max_debt)
  end
  return a, b
end

-- What it may grant at now (regions::SharedRecord::grantable): what
-- remains to admit; a bucket's whole rate.
local function grantable(a, b, c, window, now, share, per, kind)
  if kind == '9' then return max(0, share + c) end
  if kind == '8' then return idiv(max(0, slide_room(window, a, b, now, share, per)), per) end
  return max(0, share + b) - a
end

-- The record of window written back (regions::SharedRecord::written).
local function record_write(KEYS, name, window, a, b, c, share, per, now, kind, max_debt, fill)
  if kind == '9' then
    write_record(KEYS[1], name, bucket_idle(a, b, c, share, per, fill, max_debt), a, -b, c, now)
    return
  end
  local idle
  if kind == '8' then
    idle = slide_idle(window, b, share, per)
  else
    idle = shared_idle(window, a, b, share, per)
  end
  write_record(KEYS[1], name, idle, window, a, b, now)
end

-- Units moved here at now (below 0: granted away;
-- regions::SharedRecord::shift): a bucket's refill so far counted at the
-- old rate, then its tokens clipped to the new rate's capacity.
local function shifted(a, b, c, units, kind, now, share, fill)
  if kind == '9' then
    a, b = bucket_settled(a, b, c, now, share, fill)
    c = c + units
    return min(a, bucket_capacity(max(0, share + c), fill)), b, c
  end
  if kind == '8' then return a, b - units end
  return a, b + units
end

-- What a peer heard this region used, counted again
-- (regions::SharedRecord::restore): a window's count, a sliding window's
-- net; a bucket's parts are rates, which tell no use.
local function restored(a, b, c, used, kind)
  if kind == '9' then return a, b, c end
  if kind == '8' then return a, b + used, c end
  return a + used, b, c
end

-- What the record counts as admitted at now, as peers are told
-- (regions::SharedRecord::used): of a sliding window, the previous window's
-- weight rounded up, and what it admitted (net and what moved here, as
-- the ledger l says).
local function used_at(a, b, l, n, window, now, per, kind)
  if kind == '9' then return 0 end
  if kind ~= '8' then return a end
  local moved = 0
  for r = 0, n - 1 do moved = moved + l[HEAD + 1 + n + r] - l[HEAD + 1 + r] end
  local elapsed = min(per, max(0, now - window))
  return max(0, ceil_div(a * (per - elapsed), per) + b + moved)
end

local function ledger(KEYS, ARGV)
  if not call then bind() end
  local step, now, name = ARGV[1], now_ms(ARGV[2]), ARGV[3]
  -- The region's own keys, when given (one node), after the group's.
  local own = 3
  if ARGV[6] ~= '' then own = 5 end
  local received, identity = KEYS[own], KEYS[own + 1]
  if step == 'hear' and identity and call('GET', identity) ~= ARGV[17] then return -2 end
  local per, n, previous, share = num(ARGV[4]), num(ARGV[5]), ARGV[6], num(ARGV[7])
  local kind, max_debt, fill = string.match(ARGV[8], '^(%d+):(%d+):?(.*)$')
  local bucket = kind == '9'
  max_debt, fill = num(max_debt), tonumber(fill)
  local span = period_of(per, bucket)
  local window = idiv(now, span) * span
  carried(KEYS, 1, previous)
  carried(KEYS, 2, previous)
  local stored = stored_ledger(KEYS, name, previous, per, n, now, bucket)
  local dw, da, db = 0, 0, 0
  if bucket then dw, da, db = demand_of(KEYS, name) end
  local a, b, c = record_at(KEYS, name, previous, window, share, per, now, kind, max_debt, fill)
  local foreign = stored == false or a == false
  if step == 'read' then
    if foreign then
      a, b, c, stored = 0, 0, 0, nil
      if bucket then a, b, c = bucket_at(0, 0, 0, window, share, per, fill, max_debt) end
    end
    local l = ledger_at(stored, window, per, n)
    local used = used_at(a, b, l, n, window, now, per, kind)
    -- A part that used anything has a ledger of its window before any
    -- peer hears of its use (see hear).
    if used > 0 and not foreign and (not stored or stored[1] ~= window or stored[2] ~= per) then
      ledger_write(KEYS, name, l, n, now, span)
    end
    local moved = b
    if kind == '8' then moved = 0 elseif bucket then moved = c end
    if bucket then l[4] = demand(dw, da, db, now) end
    return spack('<ddd', window, used, moved) .. spack(ledger_layout(n), unpack(l, 1, HEAD + (2 + VIEW) * n))
  end
  if num(ARGV[9]) ~= window or foreign then
    if step == 'note' then return 0 end
    return -1
  end
  local l = ledger_at(stored, window, per, n)
  if step == 'note' then
    l[3] = num(ARGV[10])
    l[4] = l[4] + num(ARGV[11])
    if bucket then
      dw, da, db = noted(dw, da, db, now, num(ARGV[11]))
      call('HSET', KEYS[2], name .. 'a', string.format('%d:%d:%d', dw, da, db))
    end
    ledger_write(KEYS, name, l, n, now, span)
    return 1
  end
  if step == 'grant' then
    local to, units = num(ARGV[10]), num(ARGV[11])
    if to >= n or units < 1 or units > grantable(a, b, c, window, now, share, per, kind) then
      return -1
    end
    local g = HEAD + 1 + to
    l[g] = l[g] + units
    a, b, c = shifted(a, b, c, -units, kind, now, share, fill)
    ledger_write(KEYS, name, l, n, now, span)
    record_write(KEYS, name, window, a, b, c, share, per, now, kind, max_debt, fill)
    return l[g]
  end
  -- hear
  local from, total = num(ARGV[11]), num(ARGV[12])
  if from >= n then return -1 end
  -- A peer heard this region used some of a window it has no ledger of:
  -- its store lost both (a flush), and what the peer heard counts again.
  local yours = num(ARGV[18])
  if yours > 0 and (not stored or stored[1] ~= window or stored[2] ~= per) then
    a, b, c = restored(a, b, c, yours, kind)
  end
  l[3] = num(ARGV[10])
  local h, g = HEAD + 1 + n + from, HEAD + 1 + from
  local added = max(0, total - l[h])
  l[h] = l[h] + added
  -- The peer heard more from here than this region knows it granted: its
  -- ledger was lost (a flush); what the peer counts is granted again.
  local lost = max(0, num(ARGV[16]) - l[g])
  l[g] = l[g] + lost
  local v = HEAD + 1 + 2 * n + VIEW * from
  for i = 0, 3 do l[v + i] = num(ARGV[13 + i]) end
  l[v + 4] = now
  ledger_write(KEYS, name, l, n, now, span)
  a, b, c = shifted(a, b, c, added - lost, kind, now, share, fill)
  record_write(KEYS, name, window, a, b, c, share, per, now, kind, max_debt, fill)
  if added > 0 and received then call('HINCRBY', received, from, added) end
  return added
end
