-- include: _lib
-- Release a mutex in one round trip and hand it to the next live waiter.
-- KEYS[1] lock key   KEYS[2] fence counter   KEYS[3] waiter queue   KEYS[4] waiter meta
-- ARGV[1] owner token (or a token prefix when ARGV[3] == '1')
-- ARGV[2] prefix of the wake-list keys
-- ARGV[3] '1' to match ARGV[1] as a prefix (a worker's main process reaping
--         the lock of a child it has killed), anything else for an exact match
-- Returns 1 when released, 0 when the caller is not the holder (nothing changed).
local holder = redis.call('GET', KEYS[1])
if not holder then
  return 0
end
if ARGV[3] == '1' then
  if string.sub(holder, 1, #ARGV[1]) ~= ARGV[1] then
    return 0
  end
elseif holder ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
handoff(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], now_ms(), false)
return 1
