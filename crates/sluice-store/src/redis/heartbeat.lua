-- sluice: one instance's heartbeat; returns how many instances are live
-- with a pepper compatible with this one's, and how many are live with
-- another pepper (their keys never meet this instance's, so every limit
-- would be counted twice).
--
-- KEYS[1]  the instances set (PREFIX:instances); members are
--          "current/previous/id": the fingerprints of an instance's current
--          and previous pepper ("" when not rotating) and its random id,
--          scored by when they expire (server time, ms)
-- ARGV[1]  this instance's id
-- ARGV[2]  how long the heartbeat lasts, ms
-- ARGV[3]  this instance's current pepper fingerprint
-- ARGV[4]  its previous pepper fingerprint, or ""
--
-- Two instances are compatible when they share a pepper, current or
-- previous: a rolling rotation is not a conflict.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local current, previous = ARGV[3], ARGV[4]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, current .. '/' .. previous .. '/' .. ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
local mine = { [current] = true }
if previous ~= '' then mine[previous] = true end
local live, others = 0, 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local c, p = string.match(member, '^([^/]*)/([^/]*)/')
  if (c and mine[c]) or (p and p ~= '' and mine[p]) then
    live = live + 1
  else
    others = others + 1
  end
end
return { live, others }
