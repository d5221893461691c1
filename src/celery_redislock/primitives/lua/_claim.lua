-- Publish-side uniqueness: a job's claim on its unique key, prepended to the
-- scripts that start "-- include: _claim".  Defines nothing but local
-- functions (prefixed unique_ / claim_, so they sit beside _lib.lua's).
--
-- One hash per unique key (see primitives/unique.py):
--   q   the job waiting to start        qd  when its claim lapses (server ms)
--   r   the job running (until_finished) rd  when that lapses unless renewed
--   t   when the throttle window ends   ti  the job that window admitted
--   '~' .. job  the job that superseded it (on_duplicate="replace", debounce)
--   xd  until when a superseded job's message may still arrive
-- The hash expires with its latest deadline, so a key whose jobs vanished
-- (a purged queue, a lost message, a dead worker) leaves nothing behind.
--
-- A run carries its claim into the acquire and release scripts of its lock
-- as one more key, KEYS[#KEYS], and one more argument, ARGV[#ARGV]:
--   'mode:hold:keep:flags:job'
--   mode   's' until_started, 'c' coalesce, 'f' until_finished
--   hold   ms the job holds the key when it waits again (its unique_ttl)
--   keep   ms a started until_finished job holds it at least (acks_late:
--          its message may be delivered again), besides its renewed lease
--   flags  'k': the job waits again after this call (a retry, a requeue)
--   job    the task id

local function unique_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function unique_int(n)
  return string.format('%.0f', n)
end

-- `id` while its deadline has not passed, else nil.
local function unique_live(id, deadline, now)
  if id and deadline and tonumber(deadline) >= now then return id end
  return nil
end

-- Expire the hash with its latest deadline; delete it when none is left.
local function unique_settle(key, now)
  local d = redis.call('HMGET', key, 'qd', 'rd', 't', 'xd')
  local last = 0
  for i = 1, 4 do
    local v = tonumber(d[i] or '0') or 0
    if v > last then last = v end
  end
  if last <= now then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, unique_int(last - now))
  end
end

-- The claim of this call, or nil when it carries none (`base`: how many
-- keys the script has of its own).
local function claim_of(keys, argv, base)
  if #keys <= base then return nil end
  local mode, hold, keep, flags, job =
    string.match(argv[#argv] or '', '^(%a):(%d+):(%d+):(%a*):(.+)$')
  if not mode then return nil end
  return {key = keys[#keys], mode = mode, hold = tonumber(hold), keep = tonumber(keep),
          flags = flags, job = job}
end

-- The job that superseded this claim's job, or false.
local function claim_superseded(C)
  return redis.call('HGET', C.key, '~' .. C.job)
end

-- The job's run was granted its lock: an until_started or coalesce job stops
-- waiting (the key frees); an until_finished job holds the key while it
-- runs, for its lease (renewed) and at least C.keep ms.
local function claim_start(C, lease)
  local now = unique_now()
  local h = redis.call('HMGET', C.key, 'q', 'r', 'rd')
  if h[1] == C.job then redis.call('HDEL', C.key, 'q', 'qd') end
  if C.mode == 'f' then
    local r = unique_live(h[2], h[3], now)
    if h[1] == C.job or r == C.job or not r then
      local ends = now + math.max(tonumber(lease), C.keep)
      redis.call('HSET', C.key, 'r', C.job, 'rd', unique_int(ends))
    end
  end
  unique_settle(C.key, now)
end

-- The job's run ended (released, or reaped after its process died): an
-- until_finished job lets the key go.  With flag 'k' the job waits again (a
-- retry, a requeue) and holds the key C.hold ms more, unless another job
-- took it meanwhile.
local function claim_end(C)
  local now = unique_now()
  local h = redis.call('HMGET', C.key, 'q', 'qd', 'r')
  if h[3] == C.job then redis.call('HDEL', C.key, 'r', 'rd') end
  if string.find(C.flags, 'k', 1, true) then
    local q = unique_live(h[1], h[2], now)
    if not q or q == C.job then
      redis.call('HSET', C.key, 'q', C.job, 'qd', unique_int(now + C.hold))
    end
  end
  unique_settle(C.key, now)
end

-- The job's run was parked (on_contention="park"): it keeps waiting, in
-- Redis now rather than the broker, and holds its key C.hold ms more.
local function claim_parked(C)
  local now = unique_now()
  local h = redis.call('HMGET', C.key, 'q', 'qd')
  if h[1] == C.job and tonumber(h[2]) < now + C.hold then
    redis.call('HSET', C.key, 'qd', unique_int(now + C.hold))
    unique_settle(C.key, now)
  end
end
