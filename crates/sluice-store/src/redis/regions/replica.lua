-- sluice: entries kept alike in every region (the admin API's overrides),
-- last writer wins (sluice-core's regions::replica::Replica::merge, step
-- for step; a differential test holds the two to identical answers).
--
-- KEYS[1]  the values: a hash, field -> value (a sealed override, in
--          lowercase hex)
-- KEYS[2]  the versions: a hash, field -> version (µs); a field with a
--          version and no value was deleted (a tombstone)
-- KEYS[3]  the change counter
-- KEYS[4]  the region's identity
-- ARGV[1]  the identity the shipper checked this store has: a store that
--          announces another since is not merged with (returns -2)
-- then per entry three: its field, its version, its value ("": deleted)
--
-- An entry replaces the stored one when its version is higher, or equal
-- and it is a tombstone where the store holds a value, or a larger value.
-- When any did, the counter moves past every version applied, and by one
-- at least. Returns how many did.

if redis.call('GET', KEYS[4]) ~= ARGV[1] then
  return -2
end
local applied, top = 0, 0
for i = 2, #ARGV, 3 do
  local field, version, value = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local stored = tonumber(redis.call('HGET', KEYS[2], field) or '0')
  local wins = version > stored
  if version == stored then
    -- A tie: a tombstone wins over a value (the expiry of that value),
    -- a larger value over a smaller one, nothing over a tombstone.
    local held = redis.call('HGET', KEYS[1], field)
    if value == '' then
      wins = held ~= false
    else
      wins = held ~= false and value > held
    end
  end
  if wins then
    if value == '' then
      redis.call('HDEL', KEYS[1], field)
    else
      redis.call('HSET', KEYS[1], field, value)
    end
    redis.call('HSET', KEYS[2], field, ARGV[i + 1])
    applied = applied + 1
    top = math.max(top, version)
  end
end
if applied > 0 then
  local last = tonumber(redis.call('GET', KEYS[3]) or '0')
  redis.call('SET', KEYS[3], string.format('%d', math.max(last + 1, top)))
end
return applied
