-- redis-rl token buckets as a Lua script, for servers that cannot load the
-- module (managed Redis services). Same semantics and the same six-integer
-- reply as RL.TAKE, RL.PEEK, RL.TAKE ... FORCE, RL.LEASE and RL.REFUND:
-- lazy continuous refill on the server's clock, new buckets full, all or
-- nothing across keys, TTL = time until full. A refusal writes nothing but,
-- as in the module, may move an expiry later: see keep_until_full.
--
-- KEYS: the buckets (one slot). ARGV: op, n, min, then capacity refill
-- period_ms for each key. op is take | peek | force | lease | refund; n is
-- the cost, WANT or TOKENS; min is the lease's MIN (ignored otherwise).
--
-- Exactness: a level is counted in units of 1/period_ms of a token, as in
-- the module. Lua numbers are doubles, exact for integers below 2^53, so
-- every bucket must have capacity * period_ms <= 2^52 and debt is floored
-- at 2^52 units (the module floors it at 10^14 tokens): every level then
-- stays within +-2^52 and every sum or difference below 2^53. A bucket's
-- state is the string "tokens fraction updated_ms".
--
-- The limits below are placeholders for rl_core::limits, filled in when the client
-- builds the script (client.rs, lua_script), after the argument helpers of
-- script_args.lua.

local MAX_TOKENS = {{MAX_TOKENS}}
local MAX_PERIOD = {{MAX_PERIOD_MS}}
local MAX_WAIT = {{MAX_WAIT_MS}}
local MAX_KEYS = {{MAX_KEYS}}
local EXACT = {{LUA_MAX_UNITS}} -- 2^52


local op = ARGV[1]
if op ~= 'take' and op ~= 'peek' and op ~= 'force' and op ~= 'lease' and op ~= 'refund' then
  fail("unknown op '" .. tostring(op) .. "'")
end
local nkeys = #KEYS
if nkeys < 1 or nkeys > MAX_KEYS then fail('numkeys must be from 1 to ' .. MAX_KEYS) end
if #ARGV ~= 3 + 3 * nkeys then fail('each key needs capacity refill period_ms') end
local n = int_arg(2, 'n', 1, MAX_TOKENS)
local min = n
if op == 'lease' then min = int_arg(3, 'MIN', 1, n) end

local cap, refill, period, full, floor_units = {}, {}, {}, {}, {}
for i = 1, nkeys do
  for j = 1, i - 1 do
    if KEYS[j] == KEYS[i] then fail("key '" .. KEYS[i] .. "' is named more than once") end
  end
  local base = 3 + 3 * (i - 1)
  cap[i] = int_arg(base + 1, 'capacity of key ' .. i, 1, MAX_TOKENS)
  refill[i] = int_arg(base + 2, 'refill of key ' .. i, 1, MAX_TOKENS)
  period[i] = int_arg(base + 3, 'period_ms of key ' .. i, 1, MAX_PERIOD)
  full[i] = cap[i] * period[i]
  if full[i] > EXACT then
    fail('capacity * period_ms of key ' .. i .. ' must be at most 2^52 for the Lua backend')
  end
  floor_units[i] = -math.min(MAX_TOKENS, fdiv(EXACT, period[i])) * period[i]
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function wait_ms(missing, r)
  if missing <= 0 then return 0 end
  return math.min(ceil_div(missing, r), MAX_WAIT)
end

-- The level of bucket i now: full when new; refilled lazily, capped at full.
-- A clock reading before the last update counts as no time passed.
local level, exists = {}, {}
for i = 1, nkeys do
  local raw = redis.call('GET', KEYS[i])
  exists[i] = raw ~= false
  if not raw then
    level[i] = full[i]
  else
    local tk, fr, ts = string.match(raw, '^(%-?%d+) (%d+) (%d+)$')
    if not tk then fail("key '" .. KEYS[i] .. "' does not hold a redis-rl Lua bucket") end
    local units = tonumber(tk) * period[i] + math.min(tonumber(fr), period[i] - 1)
    units = math.max(units, floor_units[i])
    if units >= full[i] then
      level[i] = full[i]
    else
      local elapsed = now - tonumber(ts)
      if elapsed <= 0 then
        level[i] = units
      elseif elapsed >= ceil_div(full[i] - units, refill[i]) then
        level[i] = full[i]
      else
        level[i] = units + refill[i] * elapsed
      end
    end
  end
end

local function whole(i, l)
  return fdiv(l, period[i])
end

-- remaining, limit, binding and reset at `levels`: the binding bucket has
-- the fewest whole tokens left, debt counting as none (the lower index on
-- ties).
local function standing(first, levels)
  local binding, fewest, reset = 1, nil, 0
  for i = 1, nkeys do
    local w = math.max(whole(i, levels[i]), 0)
    if fewest == nil or w < fewest then
      fewest = w
      binding = i
    end
    reset = math.max(reset, wait_ms(full[i] - levels[i], refill[i]))
  end
  return { first, fewest, 0, reset, cap[binding], binding - 1 }
end

-- A refusal: the binding bucket makes the caller wait longest for `want`
-- tokens; -1 when `want` exceeds some capacity (that bucket comes first).
local function refusal(want)
  local binding, longest, reset = 1, 0, 0
  for i = 1, nkeys do
    local wait
    if want > cap[i] then
      wait = -1
    else
      wait = wait_ms(want * period[i] - level[i], refill[i])
    end
    local worse
    if longest == -1 then
      worse = false
    elseif wait == -1 then
      worse = true
    else
      worse = wait > longest
    end
    if worse then
      longest = wait
      binding = i
    end
    reset = math.max(reset, wait_ms(full[i] - level[i], refill[i]))
  end
  return { 0, math.max(whole(binding, level[binding]), 0), longest, reset, cap[binding], binding - 1 }
end

-- Writes `levels`: a full bucket is the same as no key; otherwise the key
-- expires when its bucket would be full again.
local function store(levels)
  for i = 1, nkeys do
    local missing = full[i] - levels[i]
    if missing <= 0 then
      redis.call('DEL', KEYS[i])
    else
      local tk = whole(i, levels[i])
      local fr = levels[i] - tk * period[i]
      redis.call('SET', KEYS[i], string.format('%d %d %d', tk, fr, now),
        'PX', string.format('%d', wait_ms(missing, refill[i])))
    end
  end
end

-- After a refusal (of a take or a lease, never a peek): a key's TTL was set
-- for the parameters of its last write. If they changed since (a limit
-- lowered live), the key could expire while it still holds debits and come
-- back full; so an existing key that would expire before its bucket is full
-- under this call's parameters is kept until then.
local function keep_until_full()
  for i = 1, nkeys do
    if exists[i] then
      local until_full = wait_ms(full[i] - level[i], refill[i])
      local ttl = redis.call('PTTL', KEYS[i])
      if ttl >= 0 and ttl < until_full then
        redis.call('PEXPIRE', KEYS[i], string.format('%d', until_full))
      end
    end
  end
end

local after = {}
if op == 'force' then
  -- Always taken, into debt if need be. n * period may be inexact only when
  -- the result lies below the floor, and rounding never crosses it.
  for i = 1, nkeys do after[i] = math.max(level[i] - n * period[i], floor_units[i]) end
  store(after)
  return standing(1, after)
end
if op == 'refund' then
  -- Unused tokens back, never above capacity (same rounding argument).
  for i = 1, nkeys do after[i] = math.min(level[i] + n * period[i], full[i]) end
  store(after)
  return standing(1, after)
end

local available = nil
for i = 1, nkeys do
  local w = whole(i, level[i])
  if available == nil or w < available then available = w end
end
local granted = math.min(math.max(available, 0), n)
if granted < min then
  if op ~= 'peek' then keep_until_full() end
  return refusal(min)
end
for i = 1, nkeys do after[i] = level[i] - granted * period[i] end
if op ~= 'peek' then store(after) end
if op == 'lease' then return standing(granted, after) end
return standing(1, after)
