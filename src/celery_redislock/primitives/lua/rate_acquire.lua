-- include: _rate
-- Take a start slot of a rate limit (see _rate.lua), in one round trip.
-- KEYS[1] rate key (string: the theoretical arrival time of the next start,
--         server microseconds; expires when in the past)
-- ARGV[1] emission interval in microseconds: one start per interval (1/rate)
-- ARGV[2] burst: how many starts may come at once (>= 1)
-- ARGV[3] how far ahead a slot may be taken, in microseconds: 0 takes a slot
--         only if it is now; -1 takes the next free slot however far away
-- Returns {taken, delay}: taken 1 when the slot is the caller's (it may
-- start in `delay` microseconds, 0 for now), 0 when none was taken (the next
-- free slot is `delay` microseconds away, later than ARGV[3]).
local R = rate_at(KEYS[1], ARGV[1], ARGV[2])
local delay = rate_wait(R)
local ahead = tonumber(ARGV[3])
if ahead >= 0 and delay > ahead then
  return {0, delay}
end
rate_take(R)
return {1, delay}
