-- Extend (renew) one holder's lease of a semaphore or read-write lock.
-- KEYS[1] holders (sorted set token -> lease expiry ms)
-- KEYS[2] info (hash: the holders' fences; outlives the longest lease too)
-- ARGV[1] owner token   ARGV[2] new lease in ms, counted from now
-- Returns 1 when extended, 0 when the holder's lease had already run out.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) >= now then
  local ms = tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], 'XX', now + ms, ARGV[1])
  for _, key in ipairs(KEYS) do
    local pttl = redis.call('PTTL', key)
    if pttl ~= -1 and pttl < ms then redis.call('PEXPIRE', key, ms) end
  end
  return 1
end
return 0
