-- include: _lib
-- A waiter gives up: leave the queue, unless it was granted meanwhile.
-- KEYS[1..7] as multi_acquire.lua
-- ARGV[1] owner token   ARGV[2] wake-list key prefix
-- ARGV[3] reservation lease ms for parked tasks granted by this call
-- ARGV[4] how long the fence key is kept after a grant, in ms
-- Returns reply(): {1, fence, ...} when the waiter holds after all, else {0, ...}.
local token = ARGV[1]
local Q = multi(KEYS, ARGV[2], ARGV[3], ARGV[4])
local now = now_ms()
local out = {}
redis.call('DEL', Q.wake .. token)
local score = redis.call('ZSCORE', Q.holders, token)
if score and tonumber(score) >= now then
  return reply(1, tonumber(redis.call('HGET', Q.info, token)), '', now, out)
end
dequeue(Q, token)
prune(Q, now)
local can, grant = multi_rules(Q, now, stored_limit(Q))
requeue_lapsed(Q, now, 's')
serve(Q, now, false, can, grant, out)
return reply(0, 0, '', now, out)
