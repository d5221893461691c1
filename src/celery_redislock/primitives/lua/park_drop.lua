-- Take one parked run out of its primitive's line (an operator drops it or
-- re-publishes it at once).
-- KEYS[1] queue   KEYS[2] meta   KEYS[3] pmsg   KEYS[4] inflight  (see _lib.lua)
-- ARGV[1] the parked run's token
-- Returns {payload, 1 when it had been granted (in flight) else 0}, or
-- false when that token is not parked there.  A run in flight holds the
-- primitive under its token: the caller releases that hold.  Its message,
-- if already published, finds its token gone and is dropped as a duplicate.
local token = ARGV[1]
local payload = redis.call('HGET', KEYS[3], token)
if not payload then return false end
local flying = redis.call('ZREM', KEYS[4], token)
redis.call('ZREM', KEYS[1], token)
redis.call('HDEL', KEYS[2], token)
redis.call('HDEL', KEYS[3], token)
return {payload, flying}
