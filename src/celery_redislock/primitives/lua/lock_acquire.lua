-- Acquire a mutex in one round trip, or take a place in its FIFO queue.
-- KEYS[1] lock key (string: owner token, lease in PX)
-- KEYS[2] fence key (the last fence; see next_fence in _lib.lua)
-- KEYS[3] queue    KEYS[4] meta    KEYS[5] pmsg    KEYS[6] inflight  (see _lib.lua)
-- ARGV[1] owner token of the caller
-- ARGV[2] lease in ms
-- ARGV[3] how long the caller will block waiting, in ms; 0 = do not wait
-- ARGV[4] prefix of the wake-list keys (wake list = prefix .. token)
-- ARGV[5] grace in ms added to a waiter's deadline before it counts as gone
--         (never past the caller's own wait: it gives up then, so no grant
--         made after that can be left to nobody)
-- ARGV[6] how long the fence key is kept after a grant, in ms
-- ARGV[7] payload to park when contended ('' = do not park)
-- ARGV[8] reservation lease in ms for parked tasks granted by this call
-- ARGV[9] '1' when the caller is the re-published run of a parked task
-- ARGV[10] place in line of a parked task (its publish time, ms); '' = now
-- ARGV[7..10] may be left out (not parking); ARGV[8] then defaults to 10000.
-- KEYS[7], ARGV[11] the job's claim on its unique key (see _claim.lua), when
-- the run has one: a grant starts it, a park keeps it; a superseded job is
-- refused before anything is taken.
-- KEYS[7], ARGV[11] (the claim then one further on) a start under a rate
-- limit (see _rate.lua), when a call that does not wait carries one: taken
-- only with the lock; none free, nothing is taken, queued or parked.
-- Returns reply(): the fence (or {1, fence, '', now, pairs...} when parked tasks
-- were granted too) when the caller holds the lock
-- (also when it already did: a retried call whose reply was lost, or a grant
-- made by a release while it waited; a new fence then), {0, holder's
-- remaining lease ms, holder, now, pairs...} when it does not, {-1, ...} for a
-- duplicate parked run, {-2, 0, job, 0} for a job superseded by `job`,
-- {-3, µs until a start is free, '', 0} when the carried rate limit has none now.

-- The common case first, before the helpers are defined: free, nobody in line
-- (or in flight), and not the re-published run of a parked task.  The fence
-- is written before the lock: a server that refuses SET ... GET (before
-- Redis 6.2) fails the script before it has taken anything.
if ARGV[9] ~= '1' and #KEYS == 6 and redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[6]) == 0 then
  local t = redis.call('TIME')
  local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', ARGV[6], 'GET')
                        or '0')
  if last and last >= f then
    f = last + 1
    redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', ARGV[6])
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return f
end

-- include: _lib
-- include: _claim
-- include: _rate

local C = claim_of(KEYS, ARGV, 6)
if C and ARGV[9] ~= '1' then
  local by = claim_superseded(C)
  if by then return {-2, 0, by, 0} end
end
local token, ttl, wait, wake = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local R, until_free = rate_carried(KEYS, ARGV, 6)
if until_free > 0 then return {-3, until_free, '', 0} end
local grace, payload = tonumber(ARGV[5]), ARGV[7] or ''
local order = tonumber(ARGV[10] or '')
local lock = KEYS[1]
local Q = {fence = KEYS[2], queue = KEYS[3], meta = KEYS[4], pmsg = KEYS[5],
           inflight = KEYS[6], wake = wake, reserve = ARGV[8] or '10000', keep = ARGV[6]}
local out = {}

-- The caller holds the lock with fence `f`: its job's run starts.
local function held(f, now)
  if C then claim_start(C, ttl) end
  if R then rate_take(R) end
  return reply(1, f, '', now, out)
end

local front = parked_caller(Q, token, ARGV[9])
if front == 'dup' then
  return reply(-1, 0, '', 0, out)
end
local holder = redis.call('GET', lock)
if holder == token then
  -- Held already: confirmed with a new fence, never the one of the grant.
  -- That one may be older than fences handed out since (this confirmation
  -- can come late, and on a new master after a failover); a fence handed
  -- out is never lower than one handed out before it.
  redis.call('PEXPIRE', lock, ttl)
  redis.call('DEL', wake .. token)
  return held(next_fence(Q), 0)
end
if not holder and redis.call('EXISTS', Q.queue, Q.inflight) == 0 then
  -- Free with nobody in line: the common case, taken without queueing.
  local f = next_fence(Q)
  redis.call('SET', lock, token, 'PX', ttl)
  return held(f, 0)
end
local now = now_ms()
requeue_lapsed(Q, now, 'x')
if wait > 0 then
  enqueue(Q, token, nil, now + wait, ttl, 'w', 'x', front)
elseif payload ~= '' and front then
  enqueue(Q, token, nil, PARKED, Q.reserve, 'p', 'x', true)
  redis.call('HSET', Q.pmsg, token, payload)
end
if not holder then
  -- Free, but those who queued first are served first (no barging).
  local can, grant = mutex_rules(lock)
  local f = serve(Q, now, token, can, grant, out)
  if f then
    redis.call('PEXPIRE', lock, ttl)  -- a parked caller was granted its reservation
    redis.call('DEL', wake .. token)
    return held(f, now)
  end
  if can('x') then
    f = next_fence(Q)
    redis.call('SET', lock, token, 'PX', ttl)
    return held(f, now)
  end
  holder = redis.call('GET', lock)
end
local pttl = redis.call('PTTL', lock)
if wait > 0 then
  local deadline = now + wait
  if pttl > 0 and pttl < wait then
    -- The caller wakes by itself when the holder's lease runs out; a deadline
    -- past that (plus grace) means it died while waiting.
    deadline = math.min(now + pttl + grace, now + wait)
    enqueue(Q, token, nil, deadline, ttl, 'w', 'x', front)
  end
  keep_queue(Q, deadline - now)
elseif payload ~= '' and not front then
  enqueue(Q, token, order, PARKED, Q.reserve, 'p', 'x', false)
  redis.call('HSET', Q.pmsg, token, payload)
end
if C and wait == 0 and payload ~= '' then claim_parked(C) end
return reply(0, pttl, holder, now, out)
