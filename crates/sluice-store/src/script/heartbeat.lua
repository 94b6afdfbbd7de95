-- sluice: one instance's heartbeat; returns how many instances are live.
--
-- KEYS[1]  the instances set (PREFIX:instances), members are random
--          instance ids scored by when they expire (server time, ms)
-- ARGV[1]  this instance's id
-- ARGV[2]  how long the heartbeat lasts, ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
