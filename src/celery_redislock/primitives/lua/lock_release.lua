-- Release a mutex in one round trip and hand it to the next live waiter.
-- KEYS[1] lock key   KEYS[2] fence   KEYS[3..6] queue, meta, pmsg, inflight
-- ARGV[1] owner token (or a token prefix when ARGV[4] == '1')
-- ARGV[2] prefix of the wake-list keys
-- ARGV[3] how long the fence key is kept after a grant, in ms
-- ARGV[4] '1' to match ARGV[1] as a prefix (a worker's main process reaping
--         the lock of a child it has killed), anything else for an exact match
-- ARGV[5] reservation lease in ms for parked tasks granted by this call
--         (ARGV[4] and ARGV[5] may be left out: exact match, 10000 ms)
-- KEYS[7], ARGV[6] the job's claim on its unique key (see _claim.lua), when
-- the run has one: its run ends, whether or not the lock was still held
-- Returns 1 when released, {1, now, pairs...} when released and parked tasks
-- were granted (pairs: token, payload, to re-publish), {0} when the caller is
-- not the holder (nothing changed).

-- The common cases first, before the helpers are defined, in as few calls
-- as they take (a hand-over's latency is this script's running time): the
-- caller's own lock, and nobody waiting or in flight ...
if ARGV[4] ~= '1' and #KEYS == 6 and redis.call('GET', KEYS[1]) == ARGV[1] then
  local lines = redis.call('EXISTS', KEYS[3], KEYS[6])
  if lines == 0 then
    redis.call('DEL', KEYS[1])
    return 1
  end
  -- ... or a blocked waiter first in line, and no parked task in flight: it
  -- is granted here as serve() in _lib.lua would (fence, lease, wake-up).
  -- (One of the two exists: if it is the queue, ZPOPMIN finds its head.)
  if lines == 1 then
    local first = redis.call('ZPOPMIN', KEYS[3])
    local head = first[1]
    if head then
      local m = redis.call('HGET', KEYS[4], head) or ''
      local deadline, ttl, kind = string.match(m, '^(%d+):(%d+):(%a):%a$')
      local t = redis.call('TIME')
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      if kind == 'w' and tonumber(deadline) >= now then
        redis.call('HDEL', KEYS[4], head)
        local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
        local fs = string.format('%.0f', f)
        local last = tonumber(redis.call('SET', KEYS[2], fs, 'PX', ARGV[3], 'GET') or '0')
        if last and last >= f then
          fs = string.format('%.0f', last + 1)
          redis.call('SET', KEYS[2], fs, 'PX', ARGV[3])
        end
        redis.call('SET', KEYS[1], head, 'PX', ttl)
        local wake = ARGV[2] .. head
        redis.call('RPUSH', wake, fs .. ':' .. string.format('%.0f', now))  -- fence:grant time
        redis.call('PEXPIRE', wake, ttl)
        return 1
      end
      -- Anything else (gone, lapsed, parked) is served below: put it back.
      redis.call('ZADD', KEYS[3], first[2], head)
    end
  end
end

-- include: _lib
-- include: _claim

local C = claim_of(KEYS, ARGV, 6)
local function done(result)
  if C then claim_end(C) end
  return result
end

local lock = KEYS[1]
local holder = redis.call('GET', lock)
if not holder then
  return done({0})
end
if ARGV[4] == '1' then
  if string.sub(holder, 1, #ARGV[1]) ~= ARGV[1] then
    return done({0})
  end
elseif holder ~= ARGV[1] then
  return done({0})
end
if redis.call('EXISTS', KEYS[3], KEYS[6]) == 0 then
  redis.call('DEL', lock)
  return done(1)  -- nobody waiting, nothing parked in flight
end
local Q = {fence = KEYS[2], queue = KEYS[3], meta = KEYS[4], pmsg = KEYS[5],
           inflight = KEYS[6], wake = ARGV[2], reserve = ARGV[5] or '10000', keep = ARGV[3]}
local now = now_ms()
local out = {}
-- Served as if free: a grant overwrites the key (SET), so it is only
-- deleted when nobody was granted.
local can, grant = mutex_rules(lock)
requeue_lapsed(Q, now, 'x')
serve(Q, now, false, can, grant, out)
if can(nil) then
  redis.call('DEL', lock)
end
return done(released(now, out))
