-- Extend (renew) one holder's lease of a semaphore or read-write lock.
-- KEYS[1] holders (sorted set token -> lease expiry ms)
-- ARGV[1] owner token   ARGV[2] new lease in ms, counted from now
-- Returns 1 when extended, 0 when the holder's lease had already run out.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) >= now then
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  return 1
end
return 0
