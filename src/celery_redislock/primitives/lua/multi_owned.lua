-- Whether one holder of a semaphore or read-write lock still has a live lease.
-- KEYS[1] holders (sorted set token -> lease expiry ms)
-- ARGV[1] owner token
-- Returns 1 when its entry is there and its lease has not run out, else 0.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(score) >= now then return 1 end
return 0
