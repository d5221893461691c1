-- include: _lib
-- Sweep one semaphore / read-write lock for parked tasks nobody would
-- otherwise wake (see lock_recover.lua).
-- KEYS[1..7] as multi_acquire.lua
-- ARGV[1] wake-list key prefix   ARGV[2] reservation lease ms
-- ARGV[3] how long the fence key is kept after a grant, in ms
-- Returns {next check (server ms) or -1 when nothing is parked, pairs...}.
local Q = multi(KEYS, ARGV[1], ARGV[2], ARGV[3])
local now = now_ms()
local out = {}
prune(Q, now)
requeue_lapsed(Q, now, 's')
local can, grant = multi_rules(Q, now, stored_limit(Q))
serve(Q, now, false, can, grant, out)
local nxt = -1
if redis.call('HLEN', Q.pmsg) > 0 then
  nxt = now + 1000
  local h = redis.call('ZRANGE', Q.holders, 0, 0, 'WITHSCORES')
  if h[2] then nxt = math.min(nxt, tonumber(h[2]) + 1) end
  local f = redis.call('ZRANGE', Q.inflight, 0, 0, 'WITHSCORES')
  if f[2] then nxt = math.min(nxt, tonumber(f[2]) + 1) end
end
local r = {nxt}
for i = 1, #out do r[#r + 1] = out[i] end
return r
