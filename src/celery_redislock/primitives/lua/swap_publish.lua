-- Compare-and-set a value, then PUBLISH it on the channel named after its key:
-- how Celery's Redis result backend stores a state, made conditional, so that a
-- state read and judged by the caller cannot be replaced by one written since.
-- KEYS[1] the key (a task's result key)
-- ARGV[1] the new value
-- ARGV[2] its time to live in seconds (0: none)
-- ARGV[3] the value the key must hold now ('' = the key must not exist)
-- Returns {1} when stored and published, else {0, the value now (nil: none)}.
local now = redis.call('GET', KEYS[1])
if (now or '') ~= ARGV[3] then
  return {0, now}
end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return {1}
