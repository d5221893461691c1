-- Shared helpers, prepended by scripts.py to every script that starts with
-- "-- include: _lib".  Defines nothing but local functions.
--
-- Every primitive keeps one FIFO queue of would-be holders:
--   queue  sorted set  token -> arrival (ms); the head is served first
--   meta   hash        token -> "deadline_ms:lease_ms:kind:mode"
--          kind 'w': a blocked caller, woken by a push to its wake list
--          kind 'p': a parked task message (payload in pmsg), re-published
--                    by whoever's script grants it; deadline is unbounded
--          mode: 'x' (exclusive: mutex, or the write side of a read-write
--          lock), 's' (semaphore permit), 'r' (read side)
--   pmsg   hash        token -> payload of a parked task (until claimed)
--   inflight sorted set token -> reservation deadline of a granted parked
--          task not yet claimed by its re-published run

-- Deadline of parked entries: they wait as long as it takes.  A string, since
-- Lua would print so large a number in exponent form.
local PARKED = '9007199254740991'

-- Milliseconds from the server's clock, never a worker's.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The fencing token of a new grant: the server's clock in microseconds, or
-- one more than the last fence of this name when that is higher.  The fence
-- key is kept for Q.keep ms after each grant; when it is gone (expired, or
-- lost with a restart or a failover) the clock alone keeps fences rising.
-- A string for SET: Lua would write so large a number in exponent form.
local function next_fence(Q)
  local t = redis.call('TIME')
  local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('SET', Q.fence, string.format('%.0f', f), 'PX', Q.keep, 'GET')
                        or '0')
  if last and last >= f then
    f = last + 1
    redis.call('SET', Q.fence, string.format('%.0f', f), 'PX', Q.keep)
  end
  return f
end

-- A fence (or any large integer) as a command argument: Redis would write a
-- Lua number in exponent form.
local function int(n)
  return string.format('%.0f', n)
end

-- Let `key` live at least `ms` more milliseconds (never shorten its life).
local function outlive(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- The queue of a caller left waiting: it expires with the latest deadline of
-- its waiters, so a name whose waiters all died leaves nothing behind; while
-- parked tasks wait (real work, however long) it never expires.
local function keep_queue(Q, ms)
  if redis.call('EXISTS', Q.pmsg, Q.inflight) == 0 then
    outlive(Q.queue, ms)
    outlive(Q.meta, ms)
  else
    redis.call('PERSIST', Q.queue)
    redis.call('PERSIST', Q.meta)
    if Q.info then redis.call('PERSIST', Q.info) end  -- (a semaphore's limit)
  end
end

local function parse_meta(m)
  local deadline, ttl, kind, mode = string.match(m, '^(%d+):(%d+):(%a):(%a)$')
  return tonumber(deadline), ttl, kind, mode
end

-- Queue `token` (a blocked waiter or a parked task).  NX keeps the original
-- place in line when a waiter calls again; `front` puts it at the head (a
-- parked task whose reservation lapsed was next in line already).
-- `score` nil means "now": arrival on the server's clock in microseconds,
-- and always after the current tail, so arrival order is kept exactly.
-- A parked entry makes the queue permanent (see keep_queue).
local function enqueue(Q, token, score, deadline, ttl, kind, mode, front)
  if kind == 'p' then
    redis.call('PERSIST', Q.queue)
    redis.call('PERSIST', Q.meta)
    if Q.info then redis.call('PERSIST', Q.info) end
  end
  if front then
    score = 0
  elseif not score then
    local t = redis.call('TIME')
    score = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
    local tail = redis.call('ZRANGE', Q.queue, -1, -1, 'WITHSCORES')
    if tail[2] and tonumber(tail[2]) >= score then score = tonumber(tail[2]) + 0.001 end
  end
  redis.call('ZADD', Q.queue, 'NX', score, token)
  redis.call('HSET', Q.meta, token, deadline .. ':' .. ttl .. ':' .. kind .. ':' .. mode)
end

local function dequeue(Q, token)
  redis.call('ZREM', Q.queue, token)
  redis.call('HDEL', Q.meta, token)
end

-- FIFO handoff.  Walks the queue from the head, dropping waiters whose
-- deadline has passed (they gave up or died), and grants to each live head
-- for which can(mode) holds, stopping at the first that must wait (so nobody
-- overtakes it).  grant(token, ttl, mode, fence) records the new holder.
-- Exactly the granted waiters are woken (no thundering herd): a blocked one
-- through its wake list, a parked one by appending (token, payload) to `out`
-- for the caller to re-publish.  `self` (the caller of the script) is not
-- woken; the fence it was granted is returned.
local function serve(Q, now, self, can, grant, out)
  local self_fence = nil
  while true do
    -- can(nil): could anyone at all be granted now?  (A mutex just granted
    -- cannot; this saves looking at the next head.)
    if not can(nil) then break end
    local head = redis.call('ZRANGE', Q.queue, 0, 0)[1]
    if not head then break end
    local m = redis.call('HGET', Q.meta, head)
    local deadline, ttl, kind, mode
    if m then deadline, ttl, kind, mode = parse_meta(m) end
    if not m or deadline < now then
      dequeue(Q, head)
    elseif not can(mode) then
      break
    else
      if kind == 'p' and head ~= self then
        -- Keep its meta while in flight: requeue_lapsed() needs its mode.
        redis.call('ZREM', Q.queue, head)
      else
        dequeue(Q, head)
      end
      local f = next_fence(Q)
      grant(head, ttl, mode, f)
      if head == self then
        self_fence = f
        redis.call('HDEL', Q.pmsg, head)
      elseif kind == 'p' then
        redis.call('ZADD', Q.inflight, now + tonumber(ttl), head)
        out[#out + 1] = head
        out[#out + 1] = redis.call('HGET', Q.pmsg, head) or ''
      else
        local wk = Q.wake .. head
        redis.call('RPUSH', wk, int(f) .. ':' .. int(now))  -- fence:grant time
        redis.call('PEXPIRE', wk, ttl)
      end
    end
  end
  return self_fence
end

-- A parked task's re-published run presents its token.  Returns 'dup' when
-- that token was claimed already (a duplicate delivery: drop it), 'claimed'
-- when this run is the one, or nil when the token is not a parked one.
local function claim(Q, token)
  if redis.call('ZSCORE', Q.inflight, token) or redis.call('HEXISTS', Q.pmsg, token) == 1 then
    redis.call('ZREM', Q.inflight, token)
    redis.call('HDEL', Q.pmsg, token)
    dequeue(Q, token)
    return 'claimed'
  end
  return 'dup'
end

-- The claim step of an acquire: ARGV[8] == '1' marks the re-published run
-- of a parked task.  Returns 'dup' (drop this run), true (a claimed parked
-- run: it goes to the front of the line) or false (an ordinary caller).
local function parked_caller(Q, token, flag)
  if flag ~= '1' then return false end
  if claim(Q, token) == 'dup' then return 'dup' end
  return true
end

-- Parked tasks whose reservation lapsed unclaimed (the releasing worker died
-- before re-publishing, or the message was lost): put them back at the head
-- of the queue, where serve() grants and re-publishes them.
local function requeue_lapsed(Q, now, mode)
  local lapsed = redis.call('ZRANGEBYSCORE', Q.inflight, '-inf', now - 1)
  for _, token in ipairs(lapsed) do
    redis.call('ZREM', Q.inflight, token)
    local m = redis.call('HGET', Q.meta, token)
    local mode_of = mode
    if m then mode_of = select(4, parse_meta(m)) or mode end
    enqueue(Q, token, now, PARKED, Q.reserve, 'p', mode_of, true)
  end
  return #lapsed
end

-- The reply of every acquire: {status, fence or wait hint ms, holder, now ms,
-- token, payload, ...}: status 1 = held, 0 = contended, -1 = duplicate run of
-- a parked task; the pairs are parked tasks this call granted, for the
-- caller to re-publish.  Held with nothing to re-publish (the common case)
-- is the bare fence, an integer: the cheapest reply to read.
local function reply(status, n, holder, now, out)
  if status == 1 and #out == 0 then return n end
  local r = {status, n, holder or '', now}
  for i = 1, #out do r[#r + 1] = out[i] end
  return r
end

-- The reply of every release that released: 1, or {1, now, token, payload,
-- ...} when it granted parked tasks, for the caller to re-publish.
local function released(now, out)
  if #out == 0 then return 1 end
  local r = {1, now}
  for i = 1, #out do r[#r + 1] = out[i] end
  return r
end

-- can() and grant() for serve() on a mutex: one grant while it is free.
-- Call it only when the lock is free, or is the caller's own being released (a
-- grant overwrites it).  can(nil) after serve(): nobody was granted.
local function mutex_rules(lock)
  local free = true
  local function can(mode) return free end
  local function grant(t, lease, mode, f)
    redis.call('SET', lock, t, 'PX', lease)
    free = false
  end
  return can, grant
end

-- Semaphores and read-write locks: several holders, each with its own lease.
--   holders  sorted set token -> lease expiry (server ms)
--   info     hash token -> fence of that hold; '!limit' -> the semaphore's
--            limit as last set by an acquire; '!writer' -> the write holder
-- Both expire with their longest lease, so a crashed holder leaves nothing
-- behind once its lease has run out.
local function multi(KEYS, wake, reserve, keep)
  return {holders = KEYS[1], fence = KEYS[2], queue = KEYS[3], meta = KEYS[4],
          pmsg = KEYS[5], inflight = KEYS[6], info = KEYS[7],
          wake = wake, reserve = reserve or '10000', keep = keep}
end

-- Holders and info outlive the longest lease granted or renewed; info (with
-- the semaphore's limit) is kept while parked tasks wait for it.
local function keep_holders(Q, ms)
  outlive(Q.holders, ms)
  if redis.call('EXISTS', Q.pmsg, Q.inflight) == 0 then
    outlive(Q.info, ms)
  else
    redis.call('PERSIST', Q.info)
  end
end

local function drop_holder(Q, token)
  redis.call('ZREM', Q.holders, token)
  redis.call('HDEL', Q.info, token)
  if redis.call('HGET', Q.info, '!writer') == token then
    redis.call('HDEL', Q.info, '!writer')
  end
end

-- Holders whose lease ran out (crashed) give their permit back.
local function prune(Q, now)
  for _, t in ipairs(redis.call('ZRANGEBYSCORE', Q.holders, '-inf', now - 1)) do
    drop_holder(Q, t)
  end
end

-- can() and grant() for serve(): mode 's' within the limit, 'r' while no
-- writer holds, 'x' only when nobody holds.
local function multi_rules(Q, now, limit)
  local function can(mode)
    if mode == nil then
      return true  -- depends on the mode of the head; asked again per head
    elseif mode == 's' then
      return redis.call('ZCARD', Q.holders) < limit
    elseif mode == 'r' then
      return not redis.call('HGET', Q.info, '!writer')
    end
    return redis.call('ZCARD', Q.holders) == 0
  end
  local function grant(t, lease, mode, f)
    redis.call('ZADD', Q.holders, now + tonumber(lease), t)
    redis.call('HSET', Q.info, t, int(f))
    if mode == 'x' then
      redis.call('HSET', Q.info, '!writer', t)
    end
    keep_holders(Q, tonumber(lease))
  end
  return can, grant
end

local function stored_limit(Q)
  return tonumber(redis.call('HGET', Q.info, '!limit') or '1')
end
