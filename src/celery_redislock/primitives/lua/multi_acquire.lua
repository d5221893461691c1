-- include: _lib
-- include: _claim
-- include: _rate
-- Acquire a semaphore permit or a side of a read-write lock in one round
-- trip, or take a place in the FIFO queue.
-- KEYS[1] holders  KEYS[2] fence  KEYS[3] queue  KEYS[4] meta  KEYS[5] pmsg
-- KEYS[6] inflight  KEYS[7] info   (see _lib.lua)
-- ARGV[1] owner token   ARGV[2] lease ms   ARGV[3] wait ms (0 = do not wait)
-- ARGV[4] wake-list key prefix   ARGV[5] grace ms
-- ARGV[6] how long the fence key is kept after a grant, in ms
-- ARGV[7] payload to park when contended ('' = do not park)
-- ARGV[8] reservation lease ms for parked tasks   ARGV[9] '1' = parked run
-- ARGV[10] place in line of a parked task (its publish time, ms); '' = now
-- ARGV[11] mode: 's' semaphore, 'r' read, 'x' write
-- ARGV[12] semaphore limit (mode 's'; stored for releases to use)
-- KEYS[8], ARGV[#ARGV] the job's claim on its unique key, when the run has
-- one (see _claim.lua and lock_acquire.lua)
-- KEYS[8], ARGV[13] (the claim then one further on) a start under a rate
-- limit, when a call that does not wait carries one (see lock_acquire.lua)
-- Returns reply() as lock_acquire.lua does (-3 included); when contended the hint is the
-- time until the earliest holder's lease runs out, the holder that holder.
local C = claim_of(KEYS, ARGV, 7)
if C and ARGV[9] ~= '1' then
  local by = claim_superseded(C)
  if by then return {-2, 0, by, 0} end
end
local token, ttl, wait = ARGV[1], ARGV[2], tonumber(ARGV[3])
local R, until_free = rate_carried(KEYS, ARGV, 7)
if until_free > 0 then return {-3, until_free, '', 0} end
local grace, payload, mode = tonumber(ARGV[5]), ARGV[7], ARGV[11]
local order = tonumber(ARGV[10])
local Q = multi(KEYS, ARGV[4], ARGV[8], ARGV[6])
local out = {}

-- The caller holds it with fence `f`: its job's run starts.
local function held(f, now)
  if C then claim_start(C, ttl) end
  if R then rate_take(R) end
  return reply(1, f, '', now, out)
end

local front = parked_caller(Q, token, ARGV[9])
if front == 'dup' then
  return reply(-1, 0, '', 0, out)
end
local now = now_ms()
prune(Q, now)
if redis.call('ZSCORE', Q.holders, token) then
  -- Held already: granted again, lease and a new fence (see lock_acquire.lua).
  local _, grant = multi_rules(Q, now, 0)
  local f = next_fence(Q)
  grant(token, ttl, mode, f)
  redis.call('DEL', Q.wake .. token)
  return held(f, now)
end
if mode == 's' then
  redis.call('HSET', Q.info, '!limit', ARGV[12])
  keep_holders(Q, tonumber(ttl))
end
local can, grant = multi_rules(Q, now, stored_limit(Q))
requeue_lapsed(Q, now, mode)
if wait > 0 then
  enqueue(Q, token, nil, now + wait, ttl, 'w', mode, front)
elseif payload ~= '' and front then
  enqueue(Q, token, nil, PARKED, Q.reserve, 'p', mode, true)
  redis.call('HSET', Q.pmsg, token, payload)
end
local f = serve(Q, now, token, can, grant, out)
if f then
  redis.call('ZADD', Q.holders, now + tonumber(ttl), token)
  keep_holders(Q, tonumber(ttl))
  redis.call('DEL', Q.wake .. token)
  return held(f, now)
end
if redis.call('ZCARD', Q.queue) == 0 and can(mode) then
  f = next_fence(Q)
  grant(token, ttl, mode, f)
  return held(f, now)
end
local first = redis.call('ZRANGE', Q.holders, 0, 0, 'WITHSCORES')
local hint, holder = tonumber(ttl), ''
if first[1] then
  holder = first[1]
  hint = math.max(1, tonumber(first[2]) - now)
end
if wait > 0 then
  local deadline = now + wait
  if hint < wait then
    deadline = math.min(now + hint + grace, now + wait)
    enqueue(Q, token, nil, deadline, ttl, 'w', mode, front)
  end
  keep_queue(Q, deadline - now)
elseif payload ~= '' and not front then
  enqueue(Q, token, order, PARKED, Q.reserve, 'p', mode, false)
  redis.call('HSET', Q.pmsg, token, payload)
end
if C and wait == 0 and payload ~= '' then claim_parked(C) end
return reply(0, hint, holder, now, out)
