-- sluice: helpers shared by the scripts (prepended to each).

-- Globals read once (each global access is a table lookup), by bind():
-- a Redis Function's library is loaded where no global is visible, so it
-- binds them on its first call; a script binds them on every call.
local floor, max, min, num, call, format, find, sub, spack, sunpack

local function bind()
  floor, max, min, num, call = math.floor, math.max, math.min, tonumber, redis.call
  format, find, sub = string.format, string.find, string.sub
  spack, sunpack = struct.pack, struct.unpack
end

-- floor(a / b) for integers 0 <= a < 2^53, b > 0, exact despite doubles.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- A state as "a", "a:b" or "a:b:c" (whole numbers), and back.
local function enc(a, b, c)
  if c then return format('%d:%d:%d', a, b, c) end
  if b then return format('%d:%d', a, b) end
  return format('%d', a)
end

local function dec(value)
  local i = find(value, ':', 1, true)
  if not i then return num(value) end
  local j = find(value, ':', i + 1, true)
  if not j then return num(sub(value, 1, i - 1)), num(sub(value, i + 1)) end
  return num(sub(value, 1, i - 1)), num(sub(value, i + 1, j - 1)), num(sub(value, j + 1))
end

-- The time in ms: arg, or the server's clock (TIME) when arg is "". The
-- seconds change once a second: they are parsed once (equal strings are
-- one object in Lua, so comparing them costs nothing).
local seconds, seconds_ms

local function now_ms(arg)
  if arg ~= '' then return num(arg) end
  local t = call('TIME')
  if t[1] ~= seconds then
    seconds, seconds_ms = t[1], num(t[1]) * 1000
  end
  return seconds_ms + floor(num(t[2]) / 1000)
end
