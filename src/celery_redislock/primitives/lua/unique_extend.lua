-- Renew the hold of a running until_finished job on its unique key.
-- KEYS[1] the unique hash (see _claim.lua)
-- ARGV[1] the job   ARGV[2] ms it holds the key from now, at least
-- Returns 1 when renewed, 0 when the job no longer holds the key.
-- include: _claim
local key, job, ms = KEYS[1], ARGV[1], tonumber(ARGV[2])
local h = redis.call('HMGET', key, 'r', 'rd')
if h[1] ~= job then return 0 end
local now = unique_now()
if tonumber(h[2]) < now + ms then
  redis.call('HSET', key, 'rd', unique_int(now + ms))
  unique_settle(key, now)
end
return 1
