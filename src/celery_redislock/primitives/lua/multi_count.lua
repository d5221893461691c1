-- Count the live holders of a semaphore or read-write lock.
-- KEYS[1] holders (sorted set token -> lease expiry ms)
-- Returns the number of holders whose lease has not run out.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], now, '+inf')
