-- Shared by the Lua backend's scripts (put before each by the client):
-- an error reply naming what is wrong, and an integer argument in range.
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
