-- Shared helpers, prepended by scripts.py to every script that starts with
-- "-- include: _lib".  Defines nothing but local functions.

-- Milliseconds from the server's clock, never a worker's.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- FIFO handoff of a free mutex.  Pops waiters from the head of the queue,
-- dropping those whose deadline has passed (they gave up or died), and grants
-- the lock to the first live one: the lock key is set to its token with its
-- own lease, the fence is incremented, and the fence is pushed to its wake
-- list (unless it is `self`, the caller of the script, who learns it from the
-- reply).  Exactly one waiter is woken: no thundering herd.
-- Returns the granted token and its fence, or nil when nobody is waiting.
local function handoff(lock, fence, queue, meta, wake, now, self)
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
      return nil
    end
    local m = redis.call('HGET', meta, head)
    redis.call('ZREM', queue, head)
    redis.call('HDEL', meta, head)
    if m then
      local sep = string.find(m, ':', 1, true)
      local deadline = tonumber(string.sub(m, 1, sep - 1))
      local ttl = string.sub(m, sep + 1)
      if deadline >= now then
        local f = redis.call('INCR', fence)
        redis.call('SET', lock, head, 'PX', ttl)
        if head ~= self then
          local wk = wake .. head
          redis.call('RPUSH', wk, f)
          redis.call('PEXPIRE', wk, ttl)
        end
        return head, f
      end
    end
  end
end
