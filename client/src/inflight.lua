-- redis-rl in-flight limits as a Lua script over sorted sets, for servers
-- that cannot load the module. Same semantics and the same reply as
-- RL.ACQUIRE, RL.INFLIGHT and RL.RELEASE: each key holds slots, a slot an
-- id, a deadline on the server's clock (Redis TIME) and a count; a call
-- leaves out the slots at or past their deadline (a lost release heals);
-- all or nothing across keys; an id already held renews its slot.
--
-- A key is a sorted set: member "count:id", score its deadline in ms. The
-- writing calls first drop the expired members (ZREMRANGEBYSCORE), an
-- acquire adds its member with ZADD, and the key expires at its latest
-- deadline, so an idle set vanishes by itself. A call reads the live
-- members: O(slots held), as in the module.
--
-- KEYS: the in-flight keys (one slot). ARGV: op (acquire | inflight |
-- release), id, cost, then limit timeout_ms for each key (release: none).
-- Reply (acquire, inflight): { allowed, in_flight, retry_after_ms (-1: cost
-- above a limit), limit, binding index, id }; release: the number of keys
-- where the id held a slot. The argument helpers (fail, int_arg) come from
-- script_args.lua, put before this script by the client.

local MAX_LIMIT = {{MAX_INFLIGHT_LIMIT}}
local MAX_TIMEOUT = {{MAX_PERIOD_MS}}
local MAX_WAIT = {{MAX_WAIT_MS}}
local MAX_KEYS = {{MAX_KEYS}}
local MAX_ID = {{MAX_ID_LEN}}

local op = ARGV[1]
if op ~= 'acquire' and op ~= 'inflight' and op ~= 'release' then
  fail("unknown op '" .. tostring(op) .. "'")
end
local nkeys = #KEYS
if nkeys < 1 or nkeys > MAX_KEYS then fail('numkeys must be from 1 to ' .. MAX_KEYS) end
local id = ARGV[2]
-- RL.INFLIGHT may go without an id (""): no slot is held by nobody.
if id == nil or #id > MAX_ID or (#id == 0 and op ~= 'inflight') then
  fail('ID must be 1 to ' .. MAX_ID .. ' bytes, got ' .. #(id or '') .. ' bytes')
end
for i = 1, nkeys do
  for j = 1, i - 1 do
    if KEYS[j] == KEYS[i] then fail("key '" .. KEYS[i] .. "' is named more than once") end
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The live slots of key i other than `id`'s, by deadline (earliest
-- first), as { deadline, count } pairs; and whether `id` holds one.
local function live(i)
  local raw = redis.call('ZRANGEBYSCORE', KEYS[i], '(' .. now, '+inf', 'WITHSCORES')
  local others, held, member = {}, nil, nil
  for j = 1, #raw, 2 do
    local count, owner = string.match(raw[j], '^(%d+):(.*)$')
    if not count then fail("key '" .. KEYS[i] .. "' does not hold a redis-rl Lua in-flight set") end
    if owner == id then
      held = raw[j]
    else
      others[#others + 1] = { tonumber(raw[j + 1]), tonumber(count) }
    end
  end
  return others, held
end

if op == 'release' then
  if #ARGV ~= 2 then fail('release takes no limits') end
  -- Every key is read before any is written: a key of the wrong type
  -- fails the call with nothing written.
  local others, held, released = {}, {}, 0
  for i = 1, nkeys do others[i], held[i] = live(i) end
  for i = 1, nkeys do
    if held[i] then
      released = released + 1
      redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
      redis.call('ZREM', KEYS[i], held[i])
      if #others[i] == 0 then
        redis.call('DEL', KEYS[i])
      else
        local latest = 0
        for _, s in ipairs(others[i]) do latest = math.max(latest, s[1]) end
        redis.call('PEXPIREAT', KEYS[i], string.format('%d', latest))
      end
    end
  end
  return released
end

if #ARGV ~= 3 + 2 * nkeys then fail('each key needs limit timeout_ms') end
local cost = int_arg(3, 'COST', 1, MAX_LIMIT)
local limit, timeout = {}, {}
for i = 1, nkeys do
  limit[i] = int_arg(2 + 2 * i, 'limit of key ' .. i, 1, MAX_LIMIT)
  timeout[i] = int_arg(3 + 2 * i, 'timeout_ms of key ' .. i, 1, MAX_TIMEOUT)
end

-- Each key's check, as the module's: in flight besides `id`, whether
-- `cost` more fits, and the wait until enough of the earliest deadlines
-- pass (-1 when cost is above the limit).
local sets, held, in_use, admits, wait = {}, {}, {}, {}, {}
for i = 1, nkeys do
  sets[i], held[i] = live(i)
  local n = 0
  for _, s in ipairs(sets[i]) do n = n + s[2] end
  in_use[i] = n
  admits[i] = n + cost <= limit[i]
  if cost > limit[i] then
    wait[i] = -1
  elseif admits[i] then
    wait[i] = 0
  else
    local excess, freed = n + cost - limit[i], 0
    wait[i] = 0
    for _, s in ipairs(sets[i]) do
      freed = freed + s[2]
      if freed >= excess then
        wait[i] = math.min(math.max(s[1] - now, 0), MAX_WAIT)
        break
      end
    end
  end
end

local all = true
for i = 1, nkeys do all = all and admits[i] end

if not all then
  -- The binding key makes the caller wait longest (-1 the longest; the
  -- lower index on ties).
  local b = 1
  for i = 2, nkeys do
    local longer
    if wait[b] == -1 then
      longer = false
    elseif wait[i] == -1 then
      longer = true
    else
      longer = wait[i] > wait[b]
    end
    if longer then b = i end
  end
  -- The true count, as the module's: a limit lowered below what is held
  -- shows what is held.
  return { 0, in_use[b], wait[b], limit[b], b - 1, id }
end

-- Granted: the binding key has the fewest slots left after the call.
local b = 1
for i = 2, nkeys do
  if limit[i] - in_use[i] - cost < limit[b] - in_use[b] - cost then b = i end
end
if op == 'acquire' then
  for i = 1, nkeys do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    if held[i] then redis.call('ZREM', KEYS[i], held[i]) end
    local deadline = now + timeout[i]
    redis.call('ZADD', KEYS[i], deadline, string.format('%d', cost) .. ':' .. id)
    local latest = deadline
    for _, s in ipairs(sets[i]) do latest = math.max(latest, s[1]) end
    redis.call('PEXPIREAT', KEYS[i], string.format('%d', latest))
  end
end
return { 1, in_use[b] + cost, 0, limit[b], b - 1, id }
