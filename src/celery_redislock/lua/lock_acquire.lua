-- include: _lib
-- Acquire a mutex in one round trip, or take a place in its FIFO queue.
-- KEYS[1] lock key (string: owner token, lease in PX)
-- KEYS[2] fence counter (INCR on every grant, never expires)
-- KEYS[3] waiter queue (sorted set: owner token -> arrival ms)
-- KEYS[4] waiter meta (hash: owner token -> "deadline_ms:lease_ms")
-- ARGV[1] owner token of the caller
-- ARGV[2] lease in ms
-- ARGV[3] how long the caller is prepared to wait, in ms; 0 = do not queue
-- ARGV[4] prefix of the wake-list keys (wake list = prefix .. token)
-- ARGV[5] grace in ms added to a waiter's deadline before it counts as gone
-- Returns {1, fence} when the caller now holds the lock (also when it already
-- did: a retried call whose first reply was lost, or a grant made by a release
-- while the caller waited), or {0, holder's remaining lease in ms, holder token}.
local token, ttl, wait, wake = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local grace = tonumber(ARGV[5])
local holder = redis.call('GET', KEYS[1])
if holder == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('DEL', wake .. token)
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
local now = now_ms()
if wait > 0 then
  -- NX keeps the original place in line when a waiter calls again.
  redis.call('ZADD', KEYS[3], 'NX', now, token)
  redis.call('HSET', KEYS[4], token, (now + wait + grace) .. ':' .. ttl)
end
if not holder then
  -- Free, but waiters that arrived first are served first (no barging).
  local granted, f = handoff(KEYS[1], KEYS[2], KEYS[3], KEYS[4], wake, now, token)
  if granted == token then
    redis.call('DEL', wake .. token)
    return {1, f}
  end
  if not granted then
    f = redis.call('INCR', KEYS[2])
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    return {1, f}
  end
  holder = granted
end
local pttl = redis.call('PTTL', KEYS[1])
if wait > 0 and pttl > 0 and pttl < wait then
  -- The caller will wake by itself when the holder's lease runs out; a
  -- deadline past that (plus grace) means it died while waiting.
  redis.call('HSET', KEYS[4], token, (now + pttl + grace) .. ':' .. ttl)
end
return {0, pttl, holder}
