-- include: _lib
-- include: _claim
-- Give back a semaphore permit or a read-write hold, and serve the queue.
-- KEYS[1..7] as multi_acquire.lua
-- ARGV[1] owner token (or a token prefix when ARGV[4] == '1')
-- ARGV[2] wake-list key prefix
-- ARGV[3] how long the fence key is kept after a grant, in ms
-- ARGV[4] '1' to match ARGV[1] as a prefix (reaping a killed child's holds)
-- ARGV[5] reservation lease ms for parked tasks granted by this call
-- KEYS[8], ARGV[6] the job's claim on its unique key, when the run has one:
-- its run ends, whether or not it still held (see _claim.lua)
-- Returns 1 when released, {1, now, pairs...} when released and parked tasks
-- were granted, {0} when the caller held nothing (its lease had run out).
-- The info hash (the stored limit) goes with the last holder when nobody
-- waits, so a name leaves no keys behind once nobody uses it.
local Q = multi(KEYS, ARGV[2], ARGV[5], ARGV[3])
local C = claim_of(KEYS, ARGV, 7)
if C then claim_end(C) end
local now = now_ms()
local mine = {}
if ARGV[4] == '1' then
  for _, t in ipairs(redis.call('ZRANGEBYSCORE', Q.holders, now, '+inf')) do
    if string.sub(t, 1, #ARGV[1]) == ARGV[1] then mine[#mine + 1] = t end
  end
else
  local score = redis.call('ZSCORE', Q.holders, ARGV[1])
  if score and tonumber(score) >= now then mine[1] = ARGV[1] end
end
prune(Q, now)
if #mine == 0 then
  return {0}
end
for _, t in ipairs(mine) do
  drop_holder(Q, t)
end
local out = {}
local can, grant = multi_rules(Q, now, stored_limit(Q))
requeue_lapsed(Q, now, 's')
serve(Q, now, false, can, grant, out)
if redis.call('EXISTS', Q.holders, Q.queue, Q.inflight) == 0 then
  redis.call('DEL', Q.info)
end
return released(now, out)
