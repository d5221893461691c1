-- Store a Celery task result and publish it, unless a SUCCESS is stored
-- already: what celery's KeyValueStoreBackend._store_result does with a GET
-- first and RedisBackend.set with SETEX and PUBLISH, in one step.
-- KEYS[1] result key
-- ARGV[1] the encoded result meta (JSON)
-- ARGV[2] expiry in seconds; '0' = none
-- Returns 1 when stored and published, 0 when an earlier SUCCESS was kept.
local current = redis.call('GET', KEYS[1])
if current and string.find(current, 'SUCCESS', 1, true) then
  local ok, meta = pcall(cjson.decode, current)
  if ok and type(meta) == 'table' and meta['status'] == 'SUCCESS' then
    return 0
  end
end
local ex = tonumber(ARGV[2])
if ex and ex > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ex)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
