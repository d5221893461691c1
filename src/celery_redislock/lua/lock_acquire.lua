-- Acquire a mutex in one round trip, or take a place in its FIFO queue.
-- KEYS[1] lock key (string: owner token, lease in PX)
-- KEYS[2] fence counter (INCR on every grant, never expires)
-- KEYS[3] queue    KEYS[4] meta    KEYS[5] pmsg    KEYS[6] inflight  (see _lib.lua)
-- ARGV[1] owner token of the caller
-- ARGV[2] lease in ms
-- ARGV[3] how long the caller will block waiting, in ms; 0 = do not wait
-- ARGV[4] prefix of the wake-list keys (wake list = prefix .. token)
-- ARGV[5] grace in ms added to a waiter's deadline before it counts as gone
-- ARGV[6] payload to park when contended ('' = do not park)
-- ARGV[7] reservation lease in ms for parked tasks granted by this call
-- ARGV[8] '1' when the caller is the re-published run of a parked task
-- ARGV[9] place in line of a parked task (its publish time, ms); '' = now
-- ARGV[6..9] may be left out (not parking); ARGV[7] then defaults to 10000.
-- Returns reply(): the fence (or {1, fence, '', now, pairs...} when parked tasks
-- were granted too) when the caller holds the lock
-- (also when it already did: a retried call whose reply was lost, or a grant
-- made by a release while it waited), {0, holder's remaining lease ms, holder,
-- now, pairs...} when it does not, {-1, ...} for a duplicate parked run.

-- The common case first, before the helpers are defined: free, nobody in line
-- (or in flight), and not the re-published run of a parked task.
if ARGV[8] ~= '1' and redis.call('EXISTS', KEYS[3], KEYS[6]) == 0
    and not redis.call('GET', KEYS[1]) then
  local f = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return f
end

-- include: _lib

local token, ttl, wait, wake = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local grace, payload = tonumber(ARGV[5]), ARGV[6] or ''
local order = tonumber(ARGV[9] or '')
local lock = KEYS[1]
local Q = {fence = KEYS[2], queue = KEYS[3], meta = KEYS[4], pmsg = KEYS[5],
           inflight = KEYS[6], wake = wake, reserve = ARGV[7] or '10000'}
local out = {}
local front = parked_caller(Q, token, ARGV[8])
if front == 'dup' then
  return reply(-1, 0, '', 0, out)
end
local holder = redis.call('GET', lock)
if holder == token then
  redis.call('PEXPIRE', lock, ttl)
  redis.call('DEL', wake .. token)
  return reply(1, tonumber(redis.call('GET', KEYS[2])), '', 0, out)
end
if not holder and redis.call('EXISTS', Q.queue, Q.inflight) == 0 then
  -- Free with nobody in line: the common case, taken without queueing.
  local f = redis.call('INCR', KEYS[2])
  redis.call('SET', lock, token, 'PX', ttl)
  return reply(1, f, '', 0, out)
end
local now = now_ms()
requeue_lapsed(Q, now, 'x')
if wait > 0 then
  enqueue(Q, token, nil, now + wait + grace, ttl, 'w', 'x', front)
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
    return reply(1, f, '', now, out)
  end
  if can('x') then
    f = redis.call('INCR', KEYS[2])
    redis.call('SET', lock, token, 'PX', ttl)
    return reply(1, f, '', now, out)
  end
  holder = redis.call('GET', lock)
end
local pttl = redis.call('PTTL', lock)
if wait > 0 and pttl > 0 and pttl < wait then
  -- The caller wakes by itself when the holder's lease runs out; a deadline
  -- past that (plus grace) means it died while waiting.
  enqueue(Q, token, nil, now + pttl + grace, ttl, 'w', 'x', front)
elseif wait == 0 and payload ~= '' and not front then
  enqueue(Q, token, order, PARKED, Q.reserve, 'p', 'x', false)
  redis.call('HSET', Q.pmsg, token, payload)
end
return reply(0, pttl, holder, now, out)
