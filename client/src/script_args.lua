-- Shared by the Lua backend's scripts (put before each by the client):
-- an error reply naming what is wrong, an integer argument in range, and
-- exact integer division.
local function fail(msg)
  error({ err = 'ERR ' .. msg })
end

local function int_arg(i, what, lo, hi)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= math.floor(v) or v < lo or v > hi then
    fail(what .. ' must be an integer from ' .. string.format('%d', lo) .. ' to ' ..
      string.format('%d', hi) .. ", got '" .. tostring(ARGV[i]) .. "'")
  end
  return v
end

-- floor(a / b) for integers |a| <= 2^53, 0 < b: a correctly rounded
-- quotient of such integers never crosses an integer, so floor is exact.
local function fdiv(a, b)
  return math.floor(a / b)
end

local function ceil_div(a, b)
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end
