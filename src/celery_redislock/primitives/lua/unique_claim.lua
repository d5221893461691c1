-- One step of a run's claim on its unique key, on its own: the scripts of
-- its lock do these steps themselves, unless the lock lives in another hash
-- slot of a Redis Cluster than the unique key.
-- KEYS[1] the unique hash (see _claim.lua)
-- ARGV[1] 'check' (the job superseded?), 'start', 'end' or 'parked'
-- ARGV[2] the lease of the run's lock, ms ('start')
-- ARGV[3] the claim: 'mode:hold:keep:flags:job' (see _claim.lua)
-- Returns the job that superseded this one, or false ('check'); else 1.
-- include: _claim
local C = claim_of({KEYS[1], KEYS[1]}, {ARGV[3]}, 1)
local op = ARGV[1]
if op == 'check' then
  return claim_superseded(C)
elseif op == 'start' then
  claim_start(C, ARGV[2])
elseif op == 'end' then
  claim_end(C)
elseif op == 'parked' then
  claim_parked(C)
end
return 1
