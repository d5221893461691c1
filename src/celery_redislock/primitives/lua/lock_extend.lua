-- Extend (renew) a mutex's lease, only for its owner.
-- KEYS[1] lock key
-- ARGV[1] owner token
-- ARGV[2] new lease in ms, counted from now
-- Returns 1 when extended, 0 when the caller no longer holds the lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
