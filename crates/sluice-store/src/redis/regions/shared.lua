-- sluice: the rules shared across regions (SPEC appendix H), as a
-- decision decides them: a fixed_window (shared_window, code 7), a
-- sliding_window (shared_sliding, code 8) and a gcra or token_bucket
-- (shared_bucket, code 9) against this region's share of the pool. Their
-- twins are sluice-core's regions::window::Record, regions::sliding::Slide
-- and regions::bucket::Bucket. Follows common.lua; decide.lua, adjust.lua and
-- regions/ledger.lua follow it. Its functions are made on first use, by
-- regions() (see common.lua), and kept by name (the decisions' by their
-- code).

local regional
regions = function()
  if regional then return regional end
  -- What a shared window's record (start, count, moved) holds at now,
  -- whose window starts at window (sluice-core's regions::Record::at): the
  -- window it counts in, then its count and what moved to it. Itself in its
  -- own window, and in a later one (the clock is behind the one that wrote
  -- it: never re-dated back, or what it granted would be forgotten); from an
  -- earlier window, what it owed beyond its cap and the shares of the
  -- windows between (debt, at most max_debt: a count more than max_debt past
  -- the cap was made under
  -- another limit and reads as spent), nothing moved.
  local function shared_at(start, count, moved, window, share, per, max_debt)
    if start >= window then return start, count, moved end
    local passed = max(1, idiv(window - start, per))
    local cap = max(0, share + moved)
    if count > cap + max_debt then count = cap end
    return window, max(0, count - cap - (passed - 1) * share), 0
  end

  -- When a shared window's record of window at goes idle: the window's end,
  -- and as many windows more as its share takes to repay what it owes
  -- beyond its cap (sluice-core's regions::Record::idle).
  local function shared_idle(at, count, moved, share, per)
    local owed = count - max(0, share + moved)
    if owed <= 0 then return at + per end
    return at + per * (1 + ceil_div(owed, max(1, share)))
  end

  -- A fixed_window shared across regions (sluice-core's regions::Stored::
  -- decide): aligned; limit is this region's share of the pool, and the
  -- record's third number what moved here in its window (heard from peers
  -- less granted to them, see regions/ledger.lua): it admits while count +
  -- cost <= share + moved.
  local function shared_window(name, found, start, count, moved, now, cost, share, per, _, _,
                                max_debt)
    local window = idiv(now, per) * per
    if not found then start, count, moved = window, 0, 0 end
    local at
    at, count, moved = shared_at(start, count, moved, window, share, per, max_debt)
    local cap = max(0, share + moved)
    local ends_in = max(1, at + per - now)
    if count + cost <= cap then
      return 1, cap - count - cost, ends_in, 0,
        spack(RECORD, name, at + per, at, count + cost, moved), at + per
    end
    -- Owing, it waits for the window whose carried debt leaves room for it
    -- (a count more than max_debt past the cap carries nothing); a cost
    -- above the share fits
    -- only with grants: the window's end.
    local retry = ends_in
    if cost <= share then
      local c = count
      if c > cap + max_debt then c = cap end
      retry = ends_in + ceil_div(max(0, c + cost - cap - share), share) * per
    end
    return 0, max(0, cap - count), ends_in, retry
  end

  -- A sliding_window shared across regions keeps (start, carried, net):
  -- what the previous window weighs here at full weight, and what the
  -- window admitted less what moved here (sluice-core's regions::sliding).
  -- The record as the window starting at window reads it (Slide::at): from
  -- an earlier window, the previous one weighs what it counted beyond what
  -- moved here, at most share, and what it owed beyond opens the window;
  -- each window that passed repays share. A window past share + max_debt
  -- was counted under another limit: it reads as spent (share).
  local function slide_at(start, carried, net, window, share, per, max_debt)
    if start >= window then return start, carried, net end
    local passed = max(1, idiv(window - start, per))
    local owed = max(0, net)
    if owed > share + max_debt then owed = share end
    return window, min(share, max(0, owed - (passed - 1) * share)), max(0, owed - passed * share)
  end

  -- When it goes idle: two windows after its start, more while it owes
  -- (Slide::written).
  local function slide_idle(at, net, share, per)
    return at + per * max(2, 1 + ceil_div(max(0, net), max(1, share)))
  end

  -- What remains at now, in units x ms (Slide::room).
  local function slide_room(start, carried, net, now, share, per)
    local elapsed = min(per, max(0, now - start))
    return share * per - carried * (per - elapsed) - net * per
  end

  -- The first moment in the window starting at start at which cost fits,
  -- if it does before the window ends (Slide::fits).
  local function slide_fits(start, carried, net, cost, share, per)
    local free = (share - net - cost) * per
    if free < 0 then return nil end
    local at = 0
    if carried > 0 then at = per - min(idiv(free, carried), per) end
    if at < per then return start + at end
    return nil
  end

  -- When a denied cost fits, if nothing moves here (Slide::retry): in this
  -- window, else in the first whose debt leaves room for it, or the next.
  local function slide_retry(start, carried, net, now, cost, share, per, max_debt)
    local at = slide_fits(start, carried, net, cost, share, per)
    if at then return max(1, at - now) end
    if share == 0 then return max(1, start + per - now) end
    local _, c1, n1 = slide_at(start, carried, net, start + per, share, per, max_debt)
    local owed = c1 + max(0, n1)
    if cost > share then
      if carried == 0 and net <= 0 then return max(1, start + per - now) end
      return max(1, start + (2 + ceil_div(owed, share)) * per - now)
    end
    local j = max(1, ceil_div(max(0, owed + cost - share), share))
    local s2, c2, n2 = slide_at(start, carried, net, start + j * per, share, per, max_debt)
    at = slide_fits(s2, c2, n2, cost, share, per)
    if at then return max(1, at - now) end
    return max(1, start + (j + 1) * per - now)
  end

  -- A sliding_window shared across regions (regions::Stored::decide of a
  -- Slide): limit is this region's share of the pool; it admits while
  -- carried x (per - elapsed) / per + net + cost <= share.
  local function shared_sliding(name, found, start, carried, net, now, cost, share, per, _, _,
                                 max_debt)
    local window = idiv(now, per) * per
    if not found then start, carried, net = window, 0, 0 end
    start, carried, net = slide_at(start, carried, net, window, share, per, max_debt)
    local room = slide_room(start, carried, net, now, share, per)
    local need = cost * per
    if room >= need then
      local idle = slide_idle(start, net + cost, share, per)
      return 1, idiv(room - need, per), max(1, idle - now), 0,
        spack(RECORD, name, idle, start, carried, net + cost), idle
    end
    return 0, idiv(max(0, room), per), max(1, slide_idle(start, net, share, per) - now),
      slide_retry(start, carried, net, now, cost, share, per, max_debt)
  end

  -- A gcra or token_bucket shared across regions keeps (tokens, -at,
  -- moved) (sluice-core's regions::bucket): the units x per it holds (below
  -- 0: owing), when they were counted (stored below 0: a record of another
  -- algorithm under the same name has at >= 0 there), and the rate moved
  -- here in the epoch, units per per. Its rate is share + moved, its
  -- capacity floor(rate x fill) units x per (fill = burst x per / pool), and
  -- rates move within an epoch (the smallest multiple of per at least ten
  -- seconds; Bucket::period).

  -- A bucket's epoch (Bucket::period), its capacity at a rate, and its
  -- tokens refilled at its rate up to now, at most its capacity now
  -- (Bucket::settled).
  local function bucket_epoch(per)
    return per * max(1, ceil_div(10000, per))
  end

  local function bucket_capacity(rate, fill)
    local k = rate * fill
    return k - k % 1
  end

  local function bucket_settled(tokens, at, moved, now, share, fill)
    local rate = max(0, share + moved)
    return min(bucket_capacity(rate, fill), tokens + max(0, now - at) * rate), max(at, now)
  end

  -- The record as the epoch starting at window reads it (Bucket::at): none
  -- (at 0), or another algorithm's, full; owing more than max_debt, empty;
  -- of an earlier epoch, refilled at
  -- its rate to that epoch's end, nothing moved, clipped to the share's
  -- capacity and refilled at the share's rate since. Returns tokens, at,
  -- moved.
  local function bucket_at(tokens, at, moved, window, share, per, fill, max_debt)
    local e = bucket_epoch(per)
    if at == 0 then return bucket_capacity(share, fill), window, 0 end
    if tokens < -(max_debt * per) then tokens = 0 end
    local start = idiv(at, e) * e
    if start >= window then return tokens, at, moved end
    tokens, at = bucket_settled(tokens, at, moved, start + e, share, fill)
    tokens = min(tokens, bucket_capacity(share, fill))
    tokens, at = bucket_settled(tokens, at, 0, window, share, fill)
    return tokens, at, 0
  end

  -- When its tokens reach need at its rate, if before its epoch ends
  -- (Bucket::reaches); with within false, however many epochs on
  -- (Bucket::reaches_at_share, nothing moved).
  local function bucket_reaches(tokens, at, moved, need, share, per, fill, within)
    local rate = max(0, share + moved)
    if need > bucket_capacity(rate, fill) or rate == 0 then return nil end
    local t = at + ceil_div(max(0, need - tokens), rate)
    if within then
      local e = bucket_epoch(per)
      if t >= idiv(at, e) * e + e then return nil end
    end
    return t
  end

  -- When it is full again, from now (Bucket::full_in).
  local function bucket_full_in(tokens, at, moved, now, share, per, fill)
    local rate = max(0, share + moved)
    if rate == 0 then
      local e = bucket_epoch(per)
      return max(1, idiv(at, e) * e + e - now)
    end
    return max(1, at + ceil_div(max(0, bucket_capacity(rate, fill) - tokens), rate) - now)
  end

  -- When need fits, if nothing moves here (Bucket::retry).
  local function bucket_retry(tokens, at, moved, now, need, share, per, fill, max_debt)
    local t = bucket_reaches(tokens, at, moved, need, share, per, fill, true)
    if t then return max(1, t - now) end
    local e = bucket_epoch(per)
    local ends = idiv(at, e) * e + e
    local nt, na, nm = bucket_at(tokens, at, moved, ends, share, per, fill, max_debt)
    t = bucket_reaches(nt, na, nm, need, share, per, fill, false)
    if t then return max(1, t - now) end
    return max(1, ends - now)
  end

  -- When it goes idle (Bucket::written): once it reads as a record of none
  -- would, at the end of its epoch at the soonest, and not before its tokens
  -- (refilled to that end at its rate, at its share's after) hold the
  -- share's capacity.
  local function bucket_idle(tokens, at, moved, share, per, fill, max_debt)
    local e = bucket_epoch(per)
    local start = idiv(at, e) * e
    local ends = start + e
    local full = bucket_capacity(share, fill)
    local nt, na, nm = bucket_at(tokens, at, moved, ends, share, per, fill, max_debt)
    local fresh = ends
    if nt < full then
      fresh = bucket_reaches(nt, na, nm, full, share, per, fill, false) or ends + e
    end
    return start + e * max(1, ceil_div(max(0, fresh - start), e))
  end

  -- A gcra or token_bucket shared across regions (regions::Stored::decide
  -- of a Bucket): limit is this region's share of the pool and burst the
  -- fill; it admits while its tokens hold cost x per.
  local function shared_bucket(name, found, tokens, at, moved, now, cost, share, per, fill, _,
                               max_debt)
    if not found or at >= 0 then at = 0 else at = -at end
    local e = bucket_epoch(per)
    tokens, at, moved = bucket_at(tokens, at, moved, idiv(now, e) * e, share, per, fill, max_debt)
    tokens, at = bucket_settled(tokens, at, moved, now, share, fill)
    local need = cost * per
    if tokens >= need then
      tokens = tokens - need
      local t = bucket_idle(tokens, at, moved, share, per, fill, max_debt)
      return 1, idiv(tokens, per), bucket_full_in(tokens, at, moved, now, share, per, fill), 0,
        spack(RECORD, name, t, tokens, -at, moved), t
    end
    return 0, idiv(max(0, tokens), per), bucket_full_in(tokens, at, moved, now, share, per, fill),
      bucket_retry(tokens, at, moved, now, need, share, per, fill, max_debt)
  end
  regional = {
    [7] = shared_window, [8] = shared_sliding, [9] = shared_bucket,
    shared_at = shared_at, shared_idle = shared_idle,
    slide_at = slide_at, slide_idle = slide_idle, slide_room = slide_room,
    bucket_epoch = bucket_epoch, bucket_capacity = bucket_capacity,
    bucket_settled = bucket_settled, bucket_at = bucket_at, bucket_idle = bucket_idle,
  }
  return regional
end
