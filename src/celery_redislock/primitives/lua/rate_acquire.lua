-- Take a start slot of a rate limit: a generic cell rate algorithm (GCRA),
-- on the server's clock, in one round trip.
-- KEYS[1] rate key (string: the theoretical arrival time, TAT, of the next
--         start in server microseconds; expires when it is in the past, since
--         a key that is gone means the same: nothing owed)
-- ARGV[1] emission interval in microseconds: one start per interval (1/rate)
-- ARGV[2] burst: how many starts may come at once (>= 1); the tolerance
--         is (burst - 1) intervals
-- ARGV[3] how far ahead a slot may be taken, in microseconds: 0 takes a slot
--         only if it is now; -1 takes the next free slot however far away
-- Returns {taken, delay}: taken 1 when the slot is the caller's
-- (it may start in `delay` microseconds, 0 for now), 0 when none was taken
-- (the next free slot is `delay` microseconds away, later than ARGV[3]).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = interval * (tonumber(ARGV[2]) - 1)
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat < now then tat = now end
local delay = tat - tolerance - now
if delay < 0 then delay = 0 end
local ahead = tonumber(ARGV[3])
if ahead >= 0 and delay > ahead then
  return {0, math.ceil(delay)}
end
tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
return {1, math.ceil(delay)}
