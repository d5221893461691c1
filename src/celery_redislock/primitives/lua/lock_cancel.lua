-- include: _lib
-- A waiter gives up: leave the queue, unless a release already granted it the lock.
-- KEYS[1] lock key   KEYS[2] fence   KEYS[3..6] queue, meta, pmsg, inflight
-- ARGV[1] owner token of the waiter
-- ARGV[2] prefix of the wake-list keys
-- ARGV[3] reservation lease in ms for parked tasks granted by this call
-- ARGV[4] how long the fence key is kept after a grant, in ms
-- Returns reply(): {1, fence, ...} when the waiter holds the lock after all,
-- else {0, 0, '', now, pairs...}.
local token, wake, lock = ARGV[1], ARGV[2], KEYS[1]
local Q = {fence = KEYS[2], queue = KEYS[3], meta = KEYS[4], pmsg = KEYS[5],
           inflight = KEYS[6], wake = wake, reserve = ARGV[3], keep = ARGV[4]}
local holder = redis.call('GET', lock)
local out = {}
redis.call('DEL', wake .. token)
if holder == token then
  return reply(1, tonumber(redis.call('GET', KEYS[2])), '', 0, out)
end
dequeue(Q, token)
local now = now_ms()
if not holder then
  -- The holder's lease ran out with nobody releasing: serve the next in line.
  local can, grant = mutex_rules(lock)
  requeue_lapsed(Q, now, 'x')
  serve(Q, now, false, can, grant, out)
end
return reply(0, 0, '', now, out)
