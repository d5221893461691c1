-- The index of primitives that have parked tasks, for crash recovery sweeps,
-- and the lock store's epoch, by which a sweeper learns that the store lost
-- its data (a restart without persistence, a flush).  Both keys share one
-- hash tag of their own; each index member names one primitive ("kind:name").
-- KEYS[1] index (sorted set member -> next check, server ms)
-- KEYS[2] epoch (string: a random value written once; never expires)
-- ARGV[1] op: 'add' | 'due' | 'done'
--   add:  ARGV[2] member, ARGV[3] check after this many ms -> 1
--         (never moves an earlier check later)
--   due:  ARGV[2] max members, ARGV[3] claim ms, ARGV[4] the epoch to write
--         when there is none: members due now, each moved ARGV[3] ms ahead so
--         that concurrent sweepers do not all take it
--         -> {epoch, run_id, member, claim score, member, claim score, ...}:
--         an epoch other than the one the sweeper saw before means the data
--         is new; another run_id, that the server restarted or failed over
--   done: ARGV[2] member, ARGV[3] next check (server ms, -1 = nothing parked),
--         ARGV[4] the claim score 'due' gave it: drop the member only if no
--         'add' came in since (its score would have moved) -> 1
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]
if op == 'add' then
  local at = now + tonumber(ARGV[3])
  local cur = redis.call('ZSCORE', KEYS[1], ARGV[2])
  if not cur or tonumber(cur) > at then
    redis.call('ZADD', KEYS[1], at, ARGV[2])
  end
  return 1
elseif op == 'due' then
  local epoch = redis.call('GET', KEYS[2])
  if not epoch then
    epoch = ARGV[4]
    redis.call('SET', KEYS[2], epoch)
  end
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
  -- (pcall: an ACL may refuse INFO, a @dangerous command; the epoch still tells)
  local info = redis.pcall('INFO', 'server')
  local run_id = type(info) == 'string' and string.match(info, 'run_id:(%w+)') or ''
  local r = {epoch, run_id}
  for _, m in ipairs(due) do
    local claim = now + tonumber(ARGV[3])
    redis.call('ZADD', KEYS[1], claim, m)
    r[#r + 1] = m
    r[#r + 1] = tostring(claim)
  end
  return r
else
  local cur = redis.call('ZSCORE', KEYS[1], ARGV[2])
  local nxt = tonumber(ARGV[3])
  if cur and cur ~= ARGV[4] and tonumber(cur) < tonumber(ARGV[4]) then
    return 1  -- an 'add' asked for an earlier check; keep it
  end
  if nxt < 0 then
    redis.call('ZREM', KEYS[1], ARGV[2])
  else
    redis.call('ZADD', KEYS[1], nxt, ARGV[2])
  end
  return 1
end
