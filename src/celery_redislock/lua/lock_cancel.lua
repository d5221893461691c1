-- include: _lib
-- A waiter gives up: leave the queue, unless a release already granted it the lock.
-- KEYS[1] lock key   KEYS[2] fence counter   KEYS[3] waiter queue   KEYS[4] waiter meta
-- ARGV[1] owner token of the waiter
-- ARGV[2] prefix of the wake-list keys
-- Returns {1, fence} when the waiter holds the lock after all, else {0}.
local token, wake = ARGV[1], ARGV[2]
local holder = redis.call('GET', KEYS[1])
redis.call('DEL', wake .. token)
if holder == token then
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
redis.call('ZREM', KEYS[3], token)
redis.call('HDEL', KEYS[4], token)
if not holder then
  -- The holder's lease ran out with nobody releasing: serve the next in line.
  handoff(KEYS[1], KEYS[2], KEYS[3], KEYS[4], wake, now_ms(), false)
end
return {0}
