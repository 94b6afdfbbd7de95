-- sluice: an adaptive valve's law (sluice_core::adaptive::law::Law::step,
-- step for step; a differential test holds the two to identical answers).
-- Follows common.lua.
--
-- KEYS[1]  the law's state: little-endian doubles, the effective limit
--          (0: never stepped), the latency estimate (ms), when the limit
--          was last cut and when the law last stepped (ms)
-- ARGV[1]  now in ms ("" for the server's clock)
-- ARGV[2]  requests seen, ARGV[3] their latencies summed (ms), ARGV[4]
--          how many failed, ARGV[5] "1" when the valve denied a request
-- ARGV[6]  the valve's limit, ARGV[7] the adaptive `min`, ARGV[8] the
--          latency target (ms)
-- Returns the state as written.

local LAW = '<dddd'
-- A law not stepped for this long starts afresh (law::FORGET_MS); its key
-- lives as long.
local FORGET_MS = 600000
local HALF_WAY, FAILING, GROWTH, LEAST_CUT, MOST_CUT, MOST_GROWTH_MS = 8, 0.1, 1 / 16, 0.5, 0.9, 1000

local function adapt(KEYS, ARGV)
  bind()
  local now = now_ms(ARGV[1])
  local requests, sum, failed, full = num(ARGV[2]), num(ARGV[3]), num(ARGV[4]), ARGV[5] == '1'
  local least, most, target = max(num(ARGV[7]), 1), max(num(ARGV[6]), 1), max(num(ARGV[8]), 1)
  local limit, latency, cut_at, at = 0, 0, 0, 0
  local value = call('GET', KEYS[1])
  if value and #value == 32 then
    limit, latency, cut_at, at = sunpack(LAW, value)
  end
  if at ~= 0 and now - at > FORGET_MS then limit, latency, cut_at, at = 0, 0, 0, 0 end
  if limit <= 0 then limit = most end
  local floor = min(least, most)
  limit = min(max(limit, floor), most)
  local elapsed = 0
  if at ~= 0 then elapsed = min(max(now - at, 0), MOST_GROWTH_MS) end
  local failing = false
  if requests > 0 then
    local mean = sum / requests
    if latency <= 0 then
      latency = mean
    else
      latency = latency + (1 - 0.5 ^ (requests / HALF_WAY)) * (mean - latency)
    end
    failing = failed > FAILING * requests
  end
  local overloaded = requests > 0 and (latency > target or failing)
  -- (A cut after now: the clock stepped back; long settled.)
  local since_cut = now - cut_at
  if since_cut < 0 then since_cut = math.huge end
  local settled = since_cut >= max(target, latency)
  if overloaded then
    if settled then
      local factor = min(max(target / max(latency, target), LEAST_CUT), MOST_CUT)
      limit = max(limit * factor, floor)
      cut_at = now
    end
  elseif full and settled then
    limit = min(limit + max(limit * GROWTH, 1) * elapsed / target, most)
  end
  local written = spack(LAW, limit, latency, cut_at, now)
  call('SET', KEYS[1], written, 'PX', FORGET_MS)
  return written
end
