-- A start under a rate limit: a generic cell rate algorithm (GCRA) on the
-- server's clock, prepended to the scripts that start "-- include: _rate".
-- Defines nothing but local functions (prefixed rate_).
--
-- One string per limit, the theoretical arrival time (TAT) of the next start
-- in server microseconds; it expires once in the past (nothing owed then).
-- A start is free when TAT less the tolerance, (burst - 1) intervals, has
-- come; taking one moves TAT one interval past max(TAT, now).
--
-- A run whose lock's acquire carries its start (it is taken only with the
-- lock) adds one key, KEYS[base + 1], the rate key, and one argument,
-- 'rate:<interval µs>:<burst>', last but for a unique job's claim.

-- The limit at `key`, spacing starts `interval` µs apart, `burst` at once.
local function rate_at(key, interval, burst)
  return {key = key, interval = tonumber(interval), burst = tonumber(burst)}
end

-- The limit this call carries, or nil (`base`: how many keys the script has
-- of its own).
local function rate_of(keys, argv, base)
  if #keys <= base then return nil end
  for i = #argv, math.max(1, #argv - 1), -1 do
    local interval, burst = string.match(argv[i] or '', '^rate:([%d%.e%+]+):(%d+)$')
    if interval then return rate_at(keys[base + 1], interval, burst) end
  end
  return nil
end

-- Microseconds until a start is free under R (0: now); R remembers the
-- clock and TAT it read, for rate_take.
local function rate_wait(R)
  local t = redis.call('TIME')
  R.now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local tat = tonumber(redis.call('GET', R.key) or '0') or 0
  if tat < R.now then tat = R.now end
  R.tat = tat
  local delay = tat - R.interval * (R.burst - 1) - R.now
  if delay < 0 then return 0 end
  return math.ceil(delay)
end

-- Take the start rate_wait found (now, or `delay` µs from now).
local function rate_take(R)
  local tat = R.tat + R.interval
  redis.call('SET', R.key, string.format('%.0f', tat), 'PX', math.ceil((tat - R.now) / 1000) + 1)
end

-- The start an acquire carries, when it is one that does not wait (ARGV[3],
-- the wait, 0) and no parked run's claim of its grant (ARGV[9] '1'); and the
-- microseconds until one is free (0: now).  Else nil, 0.
local function rate_carried(keys, argv, base)
  local R = rate_of(keys, argv, base)
  if not R or tonumber(argv[3]) ~= 0 or argv[9] == '1' then return nil, 0 end
  return R, rate_wait(R)
end
