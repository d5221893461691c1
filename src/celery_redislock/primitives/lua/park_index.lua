-- The index of primitives that have parked tasks, for crash recovery sweeps.
-- It lives in its own slot; each member names one primitive ("kind:name").
-- KEYS[1] index (sorted set member -> next check, server ms)
-- ARGV[1] op: 'add' | 'due' | 'done'
--   add:  ARGV[2] member, ARGV[3] check after this many ms -> 1
--         (never moves an earlier check later)
--   due:  ARGV[2] max members, ARGV[3] claim ms: members due now, each moved
--         ARGV[3] ms ahead so that concurrent sweepers do not all take it -> list
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
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
  local r = {}
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
