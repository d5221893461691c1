-- Move a hold to another token of the same holder: a parked run, granted
-- under the token it parked with (which names the worker where it parked),
-- goes on under one naming the worker and process that run it.
-- KEYS[1] lock key (mutex) or holders (semaphore, read-write lock)
-- KEYS[7] info hash (semaphore, read-write lock)   (the primitive's keys)
-- ARGV[1] the token it holds under   ARGV[2] the new token
-- ARGV[3] 'm' for a semaphore or read-write lock, '' for a mutex
-- Returns 1 when moved, 0 when ARGV[1] holds nothing (its lease ran out).
local old, new = ARGV[1], ARGV[2]
if ARGV[3] ~= 'm' then
  if redis.call('GET', KEYS[1]) ~= old then return 0 end
  redis.call('SET', KEYS[1], new, 'PX', math.max(1, redis.call('PTTL', KEYS[1])))
  return 1
end
local expiry = redis.call('ZSCORE', KEYS[1], old)
if not expiry then return 0 end
redis.call('ZREM', KEYS[1], old)
redis.call('ZADD', KEYS[1], expiry, new)
local fence = redis.call('HGET', KEYS[7], old)
if fence then
  redis.call('HDEL', KEYS[7], old)
  redis.call('HSET', KEYS[7], new, fence)
end
if redis.call('HGET', KEYS[7], '!writer') == old then
  redis.call('HSET', KEYS[7], '!writer', new)
end
return 1
