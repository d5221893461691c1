-- Let a unique key go: a job revoked or ended before it ran, or an operator's release.
-- KEYS[1] the unique hash (see _claim.lua)
-- ARGV[1] the job to drop, or '' for whichever job holds the key (and the
--         throttle window too)
-- Returns the job that held the key and no longer does, or false.
-- Markers of superseded jobs stay: their messages are still dropped.
-- include: _claim
local key, job = KEYS[1], ARGV[1]
local now = unique_now()
local h = redis.call('HMGET', key, 'q', 'qd', 'r', 'rd')
local q, r = unique_live(h[1], h[2], now), unique_live(h[3], h[4], now)
local dropped = false
if h[1] and (job == '' or h[1] == job) then
  redis.call('HDEL', key, 'q', 'qd')
  dropped = q or false
end
if h[3] and (job == '' or h[3] == job) then
  redis.call('HDEL', key, 'r', 'rd')
  dropped = dropped or r or false
end
if job == '' then redis.call('HDEL', key, 't', 'ti') end
unique_settle(key, now)
return dropped
