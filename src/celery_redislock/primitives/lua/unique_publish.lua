-- Publish a job under its unique key, or refuse it as a duplicate: one round trip.
-- KEYS[1] the unique hash (see _claim.lua)
-- ARGV[1] the job (its task id)
-- ARGV[2] 's' until_started, 'c' coalesce, 'f' until_finished, '-' a throttle alone
-- ARGV[3] ms the job holds the key while it waits (its unique_ttl and its delay)
-- ARGV[4] '1' to supersede the waiting job (on_duplicate="replace", debounce)
-- ARGV[5] the throttle window in ms, '0' for none
-- ARGV[6] '1' when the same job is published again (a retry, a re-published
--         parked run): it is never refused, and keeps or takes its key
-- Returns {1} accepted, {2, old} accepted in place of the waiting job `old`,
-- {0, holder, ms} refused: `holder` holds the key for another `ms`.

-- The common case first, before the helpers are defined: nobody holds the key.
if redis.call('EXISTS', KEYS[1]) == 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local throttle = tonumber(ARGV[5])
  local last = 0
  if ARGV[2] ~= '-' then
    last = now + tonumber(ARGV[3])
    redis.call('HSET', KEYS[1], 'q', ARGV[1], 'qd', string.format('%.0f', last))
  end
  if throttle > 0 then
    redis.call('HSET', KEYS[1], 't', string.format('%.0f', now + throttle), 'ti', ARGV[1])
    if now + throttle > last then last = now + throttle end
  end
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', last - now))
  return {1}
end
-- ... and a duplicate of a live job, refused as it stands.
if ARGV[4] ~= '1' and ARGV[6] ~= '1' and ARGV[5] == '0' and ARGV[2] ~= '-' then
  local h = redis.call('HMGET', KEYS[1], 'q', 'qd', 'r', 'rd')
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if h[1] and h[1] ~= ARGV[1] and tonumber(h[2]) >= now then
    return {0, h[1], string.format('%.0f', tonumber(h[2]) - now)}
  end
  if ARGV[2] == 'f' and h[3] and h[3] ~= ARGV[1] and tonumber(h[4]) >= now
     and not (h[1] == ARGV[1] and tonumber(h[2]) >= now) then
    return {0, h[3], string.format('%.0f', tonumber(h[4]) - now)}
  end
end

-- include: _claim
local key, job, mode, hold = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local replace, throttle, again = ARGV[4] == '1', tonumber(ARGV[5]), ARGV[6] == '1'
local now = unique_now()
local h = redis.call('HMGET', key, 'q', 'qd', 'r', 'rd', 't', 'ti', 'xd')
local q, r = unique_live(h[1], h[2], now), unique_live(h[3], h[4], now)
local admitted = unique_live(h[6], h[5], now)

local function take()
  redis.call('HSET', key, 'q', job, 'qd', unique_int(now + hold))
  if h[3] == job then redis.call('HDEL', key, 'r', 'rd') end
end

local function window()
  if throttle > 0 then
    redis.call('HSET', key, 't', unique_int(now + throttle), 'ti', job)
  end
end

if q == job or r == job then
  -- The same job again (a retry of a waiting or running job): its own place.
  take()
  unique_settle(key, now)
  return {1}
end
if admitted and admitted ~= job then
  if again then return {1} end
  return {0, admitted, unique_int(tonumber(h[5]) - now)}
end
if mode ~= '-' then
  local holder, ends = q, h[2]
  if not holder and mode == 'f' and r then holder, ends = r, h[4] end
  if holder then
    if again then return {1} end
    if replace and q then
      -- The waiting job is dropped when its message reaches a worker.
      redis.call('HSET', key, '~' .. q, job)
      if tonumber(h[7] or '0') < tonumber(h[2]) then redis.call('HSET', key, 'xd', h[2]) end
      take()
      window()
      unique_settle(key, now)
      return {2, q}
    end
    return {0, holder, unique_int(tonumber(ends) - now)}
  end
  take()
end
window()
unique_settle(key, now)
return {1}
