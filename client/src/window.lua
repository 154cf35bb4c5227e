-- redis-rl windows as a Lua script, for servers that cannot load the module
-- (managed Redis services). Same semantics and the same reply as
-- RL.WINDOW and RL.WINDOWPEEK (rl_core::window and rl_core::exact_log,
-- ported line by line): SLIDING, FIXED and EXACT, all or nothing across
-- keys, on the server's clock, windows aligned to the Unix epoch, TIME and
-- REFUND at_ms. A refusal writes nothing but may move an expiry later.
--
-- KEYS: the windows (one slot). ARGV: mode (sliding | exact | fixed), op
-- (take | peek | refund), cost, time (1: add the clock reading as a seventh
-- integer), at_ms (the refunded call's reading; 0 unless op is refund),
-- then limit window_ms for each key.
--
-- State, a string per key: "w start previous current" for SLIDING and
-- FIXED (one kind, as in the module), "x at:count at:count ..." for an
-- EXACT log (oldest first; requests of one millisecond share an entry).
--
-- Exactness: Lua numbers are doubles, exact for integers below 2^53; every
-- window must have limit * window_ms <= 2^52 so that the weighted sums of
-- SLIDING stay exact. An EXACT log is read and written whole: its limit is
-- at most {{MAX_LUA_LOG_LIMIT}} (the module's default max-log-limit).
--
-- The limits below are placeholders for rl_core::limits, filled in when the
-- client builds the script (client.rs, lua_script).

local MAX_LIMIT = {{MAX_WINDOW_LIMIT}}
local MAX_LOG = {{MAX_LUA_LOG_LIMIT}}
local MAX_PERIOD = {{MAX_PERIOD_MS}}
local MAX_WAIT = {{MAX_WAIT_MS}}
local MAX_KEYS = {{MAX_KEYS}}
local MAX_AHEAD = {{MAX_CLOCK_AHEAD_MS}}
local EXACT = {{LUA_MAX_UNITS}} -- 2^52


local mode = ARGV[1]
if mode ~= 'sliding' and mode ~= 'exact' and mode ~= 'fixed' then
  fail("unknown mode '" .. tostring(mode) .. "'")
end
local op = ARGV[2]
if op ~= 'take' and op ~= 'peek' and op ~= 'refund' then fail("unknown op '" .. tostring(op) .. "'") end
local nkeys = #KEYS
if nkeys < 1 or nkeys > MAX_KEYS then fail('numkeys must be from 1 to ' .. MAX_KEYS) end
if #ARGV ~= 5 + 2 * nkeys then fail('each key needs limit window_ms') end
local max_limit = MAX_LIMIT
if mode == 'exact' then max_limit = MAX_LOG end
local cost = int_arg(3, 'COST', 1, max_limit)
local with_time = ARGV[4] == '1'
local limit, w = {}, {}
for i = 1, nkeys do
  for j = 1, i - 1 do
    if KEYS[j] == KEYS[i] then fail("key '" .. KEYS[i] .. "' is named more than once") end
  end
  limit[i] = int_arg(6 + 2 * (i - 1), 'limit of key ' .. i, 1, max_limit)
  w[i] = int_arg(7 + 2 * (i - 1), 'window_ms of key ' .. i, 1, MAX_PERIOD)
  if limit[i] * w[i] > EXACT then
    fail('limit * window_ms of key ' .. i .. ' must be at most 2^52 for the Lua backend')
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at_ms = 0
if op == 'refund' then at_ms = int_arg(5, 'REFUND at_ms', 0, now + MAX_AHEAD) end
local sliding = mode ~= 'fixed'

local function wait(until_ms)
  return math.min(math.max(until_ms - now, 0), MAX_WAIT)
end

local function wrongtype(i)
  error({ err = "WRONGTYPE key '" .. KEYS[i] .. "' does not hold a redis-rl Lua " .. mode .. ' window' })
end

-- The stored states: counters {start, previous, current} or logs
-- {{at, count}, ...}; nil for no key.
local state = {}
for i = 1, nkeys do
  local raw = redis.call('GET', KEYS[i])
  if raw then
    if mode == 'exact' then
      if string.sub(raw, 1, 1) ~= 'x' then wrongtype(i) end
      local log = {}
      for at, count in string.gmatch(raw, ' (%d+):(%d+)') do
        log[#log + 1] = { tonumber(at), tonumber(count) }
      end
      state[i] = log
    else
      local s, p, c = string.match(raw, '^w (%d+) (%d+) (%d+)$')
      if not s then wrongtype(i) end
      state[i] = { tonumber(s), tonumber(p), tonumber(c) }
    end
  end
end

-- SLIDING and FIXED (rl_core::window) -----------------------------------

-- The counters rolled forward to the window holding now.
local function rolled(i, s)
  local start = now - now % w[i]
  if not s then return { start, 0, 0 } end
  if start < s[1] and s[1] < start + w[i] then
    return { start, 0, math.min(s[3] + s[2], MAX_LIMIT) }
  end
  if start <= s[1] then
    local previous = s[2]
    if not sliding then previous = 0 end
    return { s[1], previous, s[3] }
  end
  local previous = 0
  if sliding and s[1] + w[i] >= start then previous = s[3] end
  return { start, previous, 0 }
end

-- When SLIDING would admit `c` from `at` on, with no other arrivals.
local function sliding_admits_at(i, s, c, at)
  local W, L = w[i], limit[i] * w[i]
  local into = at - s[1]
  local ends = s[1] + W
  local fixed = (s[3] + c) * W
  if fixed <= L then
    local excess = math.max(s[2] * (W - into) + fixed - L, 0)
    if excess == 0 then return at end
    local ms = ceil_div(excess, s[2])
    if into + ms < W then return at + ms end
  end
  local excess = math.max(s[3] * W + c * W - L, 0)
  if excess == 0 then return ends end
  local ms = ceil_div(excess, s[3])
  if ms < W then return ends + ms end
  return ends + W
end

-- One window's check of `c`: {admits, limit, remaining_now,
-- remaining_after, wait_ms, reset_now_ms, reset_after_ms}, the state to
-- store, its expiry.
local function check_counters(i, stored, c)
  local s = rolled(i, stored)
  local W = w[i]
  local into = math.min(math.max(now - s[1], 0), W - 1)
  local at = math.max(now, s[1])
  local ends = s[1] + W
  local function weighted(cur) return s[2] * (W - into) + cur * W end
  local function room(cur) return fdiv(math.max(limit[i] * W - weighted(cur), 0), W) end
  local after = s[3] + c
  local admits = weighted(after) <= limit[i] * W
  local function reset_at(cur)
    if cur > 0 then
      if sliding then return ends + W end
      return ends
    elseif sliding and s[2] > 0 then
      return ends
    end
    return now
  end
  local wait_ms
  if c > limit[i] then
    wait_ms = -1
  elseif admits then
    wait_ms = 0
  elseif sliding then
    wait_ms = wait(sliding_admits_at(i, s, c, at))
  else
    wait_ms = wait(ends)
  end
  local previous = s[2]
  if not sliding then previous = 0 end
  return { admits, limit[i], room(s[3]), room(after), wait_ms, wait(reset_at(s[3])), wait(reset_at(after)) },
    { s[1], previous, after }, reset_at(after)
end

-- EXACT (rl_core::exact_log) ---------------------------------------------

local function check_log(i, log, c)
  log = log or {}
  local W = w[i]
  local drop_before = math.max(now + 1 - W, 0)
  local used, first_live = 0, #log + 1
  for k = #log, 1, -1 do
    if log[k][1] < drop_before then break end
    used = used + log[k][2]
    first_live = k
  end
  local admits = used + c <= limit[i]
  local at = now
  if #log > 0 then at = math.max(log[#log][1], now) end
  local wait_ms
  if c > limit[i] then
    wait_ms = -1
  elseif admits then
    wait_ms = 0
  else
    -- The oldest entries leave first: wait until enough have left.
    local excess, freed, until_ms = used + c - limit[i], 0, now
    for k = first_live, #log do
      freed = freed + log[k][2]
      if freed >= excess then
        until_ms = log[k][1] + W
        break
      end
    end
    wait_ms = wait(until_ms)
  end
  local reset_now = 0
  if first_live <= #log then reset_now = wait(log[#log][1] + W) end
  return { admits, limit[i], math.max(limit[i] - used, 0), math.max(limit[i] - used - c, 0), wait_ms, reset_now,
    wait(at + W) }, { drop_before, at }, at + W
end

-- The log with `c` admitted: dead entries dropped, merged into the newest
-- entry when it is of the same millisecond.
local function appended(log, append, c)
  local out = {}
  for _, e in ipairs(log or {}) do
    if e[1] >= append[1] then out[#out + 1] = { e[1], e[2] } end
  end
  if #out > 0 and out[#out][1] == append[2] then
    out[#out][2] = out[#out][2] + c
  else
    out[#out + 1] = { append[2], c }
  end
  return out
end

-- Storing ----------------------------------------------------------------

local function encode(s)
  if mode ~= 'exact' then
    return string.format('w %d %d %d', s[1], s[2], s[3])
  end
  local parts = { 'x' }
  for _, e in ipairs(s) do parts[#parts + 1] = string.format('%d:%d', e[1], e[2]) end
  return table.concat(parts, ' ')
end

local function store(i, s, expires_at)
  redis.call('SET', KEYS[i], encode(s), 'PXAT', string.format('%d', math.max(expires_at, now + 1)))
end

local function check(i, c)
  if mode == 'exact' then return check_log(i, state[i], c) end
  return check_counters(i, state[i], c)
end

-- The six integers (seven with TIME) of `checks`: all admit, or the
-- binding one refuses (rl_core::combine::decide).
local function reply(checks)
  local out
  local all = true
  for i = 1, nkeys do all = all and checks[i][1] end
  if all then
    local b, reset = 1, 0
    for i = 1, nkeys do
      if checks[i][4] < checks[b][4] then b = i end
      reset = math.max(reset, checks[i][7])
    end
    out = { 1, checks[b][4], 0, reset, checks[b][2], b - 1 }
  else
    local b, reset = 1, 0
    for i = 1, nkeys do
      local a, longest = checks[i][5], checks[b][5]
      if longest ~= -1 and (a == -1 or a > longest) then b = i end
      reset = math.max(reset, checks[i][6])
    end
    out = { 0, checks[b][3], checks[b][5], reset, checks[b][2], b - 1 }
  end
  if with_time then out[7] = now end
  return out
end

if op == 'refund' then
  -- Each key gives back what it still counts of the call decided at at_ms;
  -- a key left with nothing is removed, one with counts keeps its expiry.
  for i = 1, nkeys do
    local s = state[i]
    local changed = false
    if s and mode == 'exact' then
      if at_ms >= math.max(now + 1 - w[i], 0) then
        local left = cost
        local out = {}
        for _, e in ipairs(s) do
          if left > 0 and e[1] >= at_ms then
            local taken = math.min(e[2], left)
            left = left - taken
            if taken < e[2] then out[#out + 1] = { e[1], e[2] - taken } end
            changed = true
          else
            out[#out + 1] = e
          end
        end
        state[i] = out
      end
    elseif s then
      local start = at_ms - at_ms % w[i]
      if s[1] == start and s[3] > 0 then
        s[3] = s[3] - math.min(cost, s[3])
        changed = true
      elseif sliding and s[1] == start + w[i] and s[2] > 0 then
        s[2] = s[2] - math.min(cost, s[2])
        changed = true
      end
    end
    if changed then
      local empty = (mode == 'exact' and #state[i] == 0) or (mode ~= 'exact' and s[2] == 0 and s[3] == 0)
      if empty then
        redis.call('DEL', KEYS[i])
        state[i] = nil
      else
        local ttl = redis.call('PTTL', KEYS[i])
        if ttl >= 0 then
          redis.call('SET', KEYS[i], encode(state[i]), 'PX', string.format('%d', math.max(ttl, 1)))
        else
          local _, _, expires_at = check(i, 1)
          store(i, state[i], expires_at)
        end
      end
    end
  end
  local checks = {}
  for i = 1, nkeys do
    local ch = check(i, 1)
    -- The windows as they stand: what is left now, nothing taken.
    checks[i] = { true, ch[2], ch[3], ch[3], 0, ch[6], ch[6] }
  end
  local out = reply(checks)
  out[7] = nil
  return out
end

local checks, after, expires = {}, {}, {}
for i = 1, nkeys do
  checks[i], after[i], expires[i] = check(i, cost)
end
local out = reply(checks)
if op == 'peek' then return out end
if out[1] > 0 then
  for i = 1, nkeys do
    local s = after[i]
    if mode == 'exact' then s = appended(state[i], after[i], cost) end
    store(i, s, expires[i])
  end
else
  -- A refusal keeps each existing key until its state, as it is now, resets.
  for i = 1, nkeys do
    if state[i] then
      local keep = checks[i][6]
      local ttl = redis.call('PTTL', KEYS[i])
      if ttl >= 0 and ttl < keep then redis.call('PEXPIRE', KEYS[i], string.format('%d', keep)) end
    end
  end
end
return out
