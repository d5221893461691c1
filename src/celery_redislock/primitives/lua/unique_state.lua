-- Who holds a unique key now.
-- KEYS[1] the unique hash (see _claim.lua)
-- Returns {waiting job, ms left, running job, ms left, throttling job, ms
-- left}, each job '' (and ms 0) when there is none.
-- include: _claim
local now = unique_now()
local h = redis.call('HMGET', KEYS[1], 'q', 'qd', 'r', 'rd', 'ti', 't')
local out = {}
for i = 1, 5, 2 do
  local id = unique_live(h[i], h[i + 1], now)
  out[#out + 1] = id or ''
  out[#out + 1] = id and unique_int(tonumber(h[i + 1]) - now) or 0
end
return out
