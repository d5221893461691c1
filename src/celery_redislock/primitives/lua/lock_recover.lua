-- include: _lib
-- Sweep one mutex for parked tasks nobody would otherwise wake: reservations
-- that lapsed unclaimed (the releasing worker died before re-publishing) and
-- queues behind a holder whose lease ran out without a release.
-- KEYS[1] lock key   KEYS[2] fence   KEYS[3..6] queue, meta, pmsg, inflight
-- ARGV[1] prefix of the wake-list keys
-- ARGV[2] reservation lease in ms for parked tasks granted by this call
-- ARGV[3] how long the fence key is kept after a grant, in ms
-- Returns {next check (server ms) or -1 when nothing is parked, pairs...}.
local lock = KEYS[1]
local Q = {fence = KEYS[2], queue = KEYS[3], meta = KEYS[4], pmsg = KEYS[5],
           inflight = KEYS[6], wake = ARGV[1], reserve = ARGV[2], keep = ARGV[3]}
local now = now_ms()
local out = {}
requeue_lapsed(Q, now, 'x')
if not redis.call('GET', lock) then
  local can, grant = mutex_rules(lock)
  serve(Q, now, false, can, grant, out)
end
local nxt = -1
if redis.call('HLEN', Q.pmsg) > 0 then
  local pttl = redis.call('PTTL', lock)
  if pttl < 0 then pttl = 0 end
  nxt = now + pttl + 1
  local first = redis.call('ZRANGE', Q.inflight, 0, 0, 'WITHSCORES')
  if first[2] and tonumber(first[2]) + 1 < nxt then nxt = tonumber(first[2]) + 1 end
end
local r = {nxt}
for i = 1, #out do r[#r + 1] = out[i] end
return r
