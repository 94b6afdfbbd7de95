-- sluice: helpers shared by the scripts (prepended to each).

-- floor(a / b) for integers 0 <= a < 2^53, b > 0, exact despite doubles.
local function idiv(a, b)
  local q = math.floor(a / b)
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

local function enc(...)
  local parts = {}
  for i, v in ipairs({...}) do
    parts[i] = string.format('%d', v)
  end
  return table.concat(parts, ':')
end

local function dec(value)
  local out = {}
  for part in string.gmatch(value, '[^:]+') do
    out[#out + 1] = tonumber(part)
  end
  return out
end


-- The time in ms: arg, or the server's clock (TIME) when arg is "".
local function now_ms(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
