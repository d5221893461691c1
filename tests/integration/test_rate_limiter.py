"""The RateLimiter against a real redis-server: spacing, bursts, refusals,
reservations, timeouts, expiry, the server's clock, round trips, Redis
Cluster, and four processes sharing one limit.

Round trips are counted client-side (tests.helpers.counting_client).  Spacing
is measured with time.monotonic() in one process; the multi-process tests
record time.time() in each process (one clock on one machine) and check every
sliding 1 s window of grants against the rate plus the burst.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

from celery_redislock import BackendUnavailable, Lock, RateLimiter
from celery_redislock.asyncio import RateLimiter as AsyncRateLimiter
from celery_redislock.primitives.rates import MAX_PER_SECOND, MIN_PER_SECOND
from tests.asyncio_support import close as aclose
from tests.cluster import LocalCluster
from tests.helpers import (
    CountingConnection,
    RoundTrips,
    counting_client,
    fork_context,
    report,
    running,
    sha,
    wait_until,
)
from tests.redis_server import free_port


def server_us(client: Any) -> int:
    """The server's clock (TIME) in microseconds, the clock the script is on."""
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def timed_acquires(limiter: RateLimiter, n: int) -> list[float]:
    """Monotonic times at which ``n`` blocking acquires returned, from the first call."""
    started = time.monotonic()
    times = []
    for _ in range(n):
        assert limiter.acquire() is True
        times.append(time.monotonic() - started)
    return times


def gaps(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


#: How early a start may seem (the first call's own round trip), and how late
#: it may come on a loaded machine (a wake-up after its sleep), in seconds.
EARLY, LATE = 0.003, 0.15


def assert_on_slots(times: Sequence[float], interval: float, burst: int = 1) -> None:
    """The k-th start (seconds from the first call) came at its slot: ``burst``
    at once, then one every ``interval``; never before it, and not much after."""
    for k, t in enumerate(sorted(times)):
        slot = max(0, k - (burst - 1)) * interval
        assert slot - EARLY <= t <= slot + LATE, f"start {k} at {t:.4f} s, its slot {slot:.3f} s"


def busiest_window(times: Sequence[float], width: float = 1.0) -> int:
    """The most grants in any half-open window ``[t, t + width)`` starting at a grant."""
    ordered = sorted(times)
    return max(
        (bisect.bisect_left(ordered, t + width) - i for i, t in enumerate(ordered)), default=0
    )


# -- spacing, bursts, refusals -------------------------------------------------


def test_blocking_acquires_are_spaced_one_interval_apart(r: redis.Redis) -> None:
    limiter = RateLimiter(r, "spaced", "20/s")
    assert_on_slots(timed_acquires(limiter, 6), 0.05)  # the first now, then one every 50 ms


def test_non_blocking_acquires_are_refused_with_exact_counts(r: redis.Redis) -> None:
    one = RateLimiter(r, "one-a-second", "1/s")
    assert [one.acquire(blocking=False) for _ in range(10)] == [True] + [False] * 9
    four = RateLimiter(r, "four-at-once", "1/s", burst=4)
    assert [four.acquire(blocking=False) for _ in range(10)] == [True] * 4 + [False] * 6
    # Refusals took nothing: the next free start is still one interval after the first.
    assert 1.0 - LATE < one.reserve() <= 1.0
    assert 1.0 - LATE < four.reserve() <= 1.0


def test_a_burst_starts_at_once_then_the_spacing_resumes(r: redis.Redis) -> None:
    limiter = RateLimiter(r, "bursty", "20/s", burst=3)
    assert_on_slots(timed_acquires(limiter, 6), 0.05, burst=3)  # three now, then every 50 ms


def test_a_burst_refills_one_start_per_idle_interval(r: redis.Redis) -> None:
    limiter = RateLimiter(r, "refill", "10/s", burst=3)
    assert [limiter.acquire(blocking=False) for _ in range(4)] == [True] * 3 + [False]
    time.sleep(0.15)  # one interval and a half idle: one start back, not two
    assert [limiter.acquire(blocking=False) for _ in range(2)] == [True, False]


def test_reserve_returns_increasing_slots_one_interval_apart(r: redis.Redis) -> None:
    limiter = RateLimiter(r, "slots", "10/s")
    slots = [limiter.reserve() for _ in range(5)]
    assert slots[0] == 0.0
    for i, gap in enumerate(gaps(slots)):
        assert 0.1 - LATE < gap <= 0.1, slots  # a reply's round trip is all that is lost
        assert slots[i + 1] <= 0.1 * (i + 1)
    # Every reserved slot is taken: nothing is free now, the next comes after the last.
    assert limiter.acquire(blocking=False) is False
    assert 0.5 - LATE < limiter.reserve() <= 0.5

    burst = RateLimiter(r, "burst-slots", "10/s", burst=2)
    slots = [burst.reserve() for _ in range(4)]
    assert slots[:2] == [0.0, 0.0]
    assert 0.1 - LATE < slots[2] <= 0.1 and 0.2 - LATE < slots[3] <= 0.2, slots


def test_the_context_manager_acquires_blocking(r: redis.Redis) -> None:
    limiter = RateLimiter(r, "with", "20/s")
    started, times = time.monotonic(), []
    for _ in range(3):
        with limiter as entered:
            assert entered is limiter
            times.append(time.monotonic() - started)
    assert_on_slots(times, 0.05)
    assert limiter.acquire(blocking=False) is False


def test_a_timeout_shorter_than_the_next_slot_returns_false_at_once_taking_nothing(
    r: redis.Redis,
) -> None:
    limiter = RateLimiter(r, "timeout", "2/s")
    assert limiter.acquire() is True
    state, pttl = r.get(limiter.key), r.pttl(limiter.key)

    started = time.monotonic()
    assert limiter.acquire(timeout=0.3) is False
    assert time.monotonic() - started < 0.1  # not a wait: nothing brings the slot closer
    assert r.get(limiter.key) == state and r.pttl(limiter.key) <= pttl
    assert limiter.acquire(blocking=False) is False
    assert r.get(limiter.key) == state

    # The slot the refused calls did not take is the next one: 0.5 s after the first.
    assert limiter.acquire(timeout=0.6) is True
    assert 0.5 - EARLY <= time.monotonic() - started <= 0.5 + LATE
    # And a timeout past the next slot waits for it.
    assert limiter.acquire(timeout=10) is True
    assert 1.0 - EARLY <= time.monotonic() - started <= 1.0 + LATE


# -- the state: one key, on the server's clock, gone when idle ------------------------


def test_the_key_holds_the_next_start_on_the_servers_clock_and_expires_when_idle(
    r: redis.Redis,
) -> None:
    limiter = RateLimiter(r, "idle", "10/s")
    assert r.exists(limiter.key) == 0
    before = server_us(r)
    assert limiter.acquire() is True
    after = server_us(r)
    tat = int(r.get(limiter.key))
    assert before + 100_000 <= tat <= after + 100_000  # now + one interval, in server µs
    assert 0 < r.pttl(limiter.key) <= 101  # gone once nothing is owed

    for _ in range(3):
        limiter.reserve()  # three more starts owed: 400 ms in all
    assert 300 < r.pttl(limiter.key) <= 401
    started = time.monotonic()
    wait_until(lambda: r.exists(limiter.key) == 0, timeout=2.0, interval=0.002)
    assert 0.3 < time.monotonic() - started < 0.4 + LATE
    # A key gone means nothing owed: a full burst is free again.
    assert limiter.acquire(blocking=False) is True


def test_the_clients_clock_is_irrelevant_two_clients_agree_on_the_servers(
    r: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose wall clock is an hour off shares the limit exactly."""
    skewed, other = redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url)
    try:
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 3600.0)
        a = RateLimiter(skewed, "clock", "10/s")
        b = RateLimiter(other, "clock", "10/s")
        before, started = server_us(r), time.monotonic()
        assert a.acquire(blocking=False) is True
        tat = int(r.get(a.key))
        assert before + 100_000 <= tat <= server_us(r) + 100_000
        assert b.acquire(blocking=False) is False
        assert 0.1 - LATE < b.reserve() <= 0.1  # the other client sees the same next start
        assert 0.2 - LATE < a.reserve() <= 0.2  # and so on, on one clock
        assert b.acquire() is True
        assert 0.3 - EARLY <= time.monotonic() - started <= 0.3 + LATE
    finally:
        skewed.close()
        other.close()


def test_the_slowest_and_the_fastest_rates_run_on_the_server(r: redis.Redis) -> None:
    year = 365 * 86400.0
    slow = RateLimiter(r, "slowest", MIN_PER_SECOND, burst=2)
    assert [slow.acquire(blocking=False) for _ in range(3)] == [True, True, False]
    assert year - 1 < slow.reserve() <= year  # then one a year, held by the key that long
    assert 3 * year * 1000 - 1000 < r.pttl(slow.key) <= 3 * year * 1000 + 1  # three owed
    fast = RateLimiter(r, "fastest", MAX_PER_SECOND)
    # A start per microsecond: no round trip comes back before the next is free.
    assert all(fast.acquire(blocking=False) for _ in range(20))
    assert fast.reserve() <= 0.000001


def test_names_and_prefixes_keep_limits_apart(r: redis.Redis) -> None:
    a, b = RateLimiter(r, "a", "1/s"), RateLimiter(r, "b", "1/s")
    other = RateLimiter(r, "a", "1/s", prefix="other")
    assert [x.acquire(blocking=False) for x in (a, b, other)] == [True, True, True]
    assert [x.acquire(blocking=False) for x in (a, b, other)] == [False, False, False]
    assert sorted(r.keys("*")) == [b"other:{a}:rate", b"redislock:{a}:rate", b"redislock:{b}:rate"]


def test_a_client_that_decodes_replies_works_the_same(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        limiter = RateLimiter(client, "decoded", "10/s")
        assert limiter.acquire(blocking=False) is True
        assert limiter.acquire(blocking=False) is False
        assert 0.1 - LATE < limiter.reserve() <= 0.1
    finally:
        client.close()


# -- cost ------------------------------------------------------------------------


def test_every_acquire_and_reserve_is_one_round_trip(r: redis.Redis, redis_url: str) -> None:
    client, trips = counting_client(redis_url)
    try:
        RateLimiter(client, "warm-up", "10/s").acquire()  # connects, loads the script
        limiter = RateLimiter(client, "trips", "20/s")
        calls = [
            lambda: limiter.acquire(),  # free: now
            lambda: limiter.acquire(),  # waits 50 ms: one call, then a sleep
            lambda: limiter.acquire(blocking=False),  # refused
            lambda: limiter.acquire(timeout=0.01),  # refused
            lambda: limiter.reserve(),
            lambda: limiter.acquire(timeout=1.0),  # waits
        ]
        for call in calls:
            trips.reset()
            call()
            assert trips.names() == [["EVALSHA"]]
            assert trips.sends[0][0][1] == sha("rate_acquire")
            assert trips.sends[0][0][3] == limiter.key.encode()

        r.script_flush()  # a restarted server: NOSCRIPT, loaded, sent again
        assert limiter.acquire(timeout=1.0) is True
    finally:
        client.close()


def test_an_unreachable_redis_raises_backend_unavailable_naming_the_key() -> None:
    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")  # nobody listens
    limiter = RateLimiter(client, "nowhere", "10/s")
    for attempt in (limiter.acquire, lambda: limiter.acquire(blocking=False), limiter.reserve):
        with pytest.raises(BackendUnavailable) as caught:
            attempt()
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
        assert limiter.key in str(caught.value)


# -- Redis Cluster -------------------------------------------------------------


@pytest.fixture
def nodes(redis_cluster: LocalCluster) -> Iterator[dict[int, redis.Redis]]:
    """A plain client on each master, by port; every node flushed first."""
    clients = {port: redis.Redis(port=port) for port in redis_cluster.ports}
    for client in clients.values():
        client.flushall()
    yield clients
    for client in clients.values():
        client.close()


def counting_cluster(cluster: LocalCluster) -> tuple[RedisCluster, dict[int, RoundTrips]]:
    """A RedisCluster whose round trips are recorded per node, by port."""
    trips = {port: RoundTrips() for port in cluster.ports}

    class PerNode(CountingConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, round_trips=trips[int(kwargs["port"])], **kwargs)

    url = f"redis://127.0.0.1:{cluster.ports[0]}"
    return RedisCluster.from_url(url, connection_class=PerNode), trips


def test_on_a_cluster_each_limit_lives_on_its_slots_node_one_round_trip_a_start(
    redis_cluster: LocalCluster, nodes: dict[int, redis.Redis]
) -> None:
    rc, trips = counting_cluster(redis_cluster)
    try:
        owners: dict[int, RateLimiter] = {}  # a limit on each master
        i = 0
        while len(owners) < len(nodes):
            limiter = RateLimiter(rc, f"api-{i}", "20/s")
            owners.setdefault(int(rc.get_node_from_key(limiter.key).port), limiter)
            i += 1
        for port, limiter in owners.items():
            # The key shares its slot with a lock of the same name: one hash tag.
            assert key_slot(limiter.key.encode()) == key_slot(Lock(rc, limiter.name).key.encode())
            assert limiter.acquire(blocking=False) is True  # (loads the script there)
            for t in trips.values():
                t.reset()
            assert limiter.acquire(blocking=False) is False
            assert 0.05 - LATE < limiter.reserve() <= 0.05
            assert [t.names(handshake=False) for p, t in trips.items() if p != port] == [[], []]
            assert trips[port].names(handshake=False) == [["EVALSHA"], ["EVALSHA"]]
            assert [p for p, node in nodes.items() if limiter.key.encode() in node.keys("*")] == [
                port
            ]

        limiter = next(iter(owners.values()))
        times = timed_acquires(limiter, 3)  # the reserved slot, then two more
        assert all(0.05 - LATE <= gap <= 0.05 + LATE for gap in gaps(times)), times
    finally:
        rc.close()


def test_on_a_cluster_sync_and_asyncio_clients_share_one_limit(
    redis_cluster: LocalCluster, nodes: dict[int, redis.Redis]
) -> None:
    rc = RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0])
    sync = RateLimiter(rc, "shared", "10/s")

    async def body() -> list[Any]:
        client = AsyncRedisCluster(host="127.0.0.1", port=redis_cluster.ports[0])
        try:
            limiter = AsyncRateLimiter(client, "shared", "10/s")
            seen: list[Any] = [await limiter.acquire(blocking=False)]
            seen.append(sync.acquire(blocking=False))
            seen.append(sync.reserve())
            seen.append(await limiter.reserve())
            return seen
        finally:
            await aclose(client)

    try:
        took, refused, first, second = asyncio.run(body())
    finally:
        rc.close()
    assert took is True and refused is False
    assert 0.1 - LATE < first <= 0.1 and 0.2 - LATE < second <= 0.2


# -- many processes, one limit ---------------------------------------------------

RATE, BURST, SECONDS, PROCESSES = 50, 1, 3.0, 4


def acquire_until(
    url: str, name: str, limit: str, burst: int, start: float, end: float, out: str
) -> None:
    """In a forked child: blocking acquires from ``start`` until ``end``
    (time.time()), recording when each returned."""
    client = redis.Redis.from_url(url)
    limiter = RateLimiter(client, name, limit, burst=burst)
    client.ping()
    time.sleep(max(0.0, start - time.time()))
    grants = []
    while time.time() < end:
        limiter.acquire()
        grants.append(time.time())
    Path(out).write_text(json.dumps(grants))


def hammer_until(
    url: str, name: str, limit: str, burst: int, start: float, end: float, out: str
) -> None:
    """In a forked child: non-blocking acquires as fast as they go until
    ``end``, recording each grant's call and return times and the refusals."""
    client = redis.Redis.from_url(url)
    limiter = RateLimiter(client, name, limit, burst=burst)
    client.ping()
    time.sleep(max(0.0, start - time.time()))
    grants, refused = [], 0
    while True:
        called = time.time()
        if called >= end:
            break
        if limiter.acquire(blocking=False):
            grants.append((called, time.time()))
        else:
            refused += 1
    Path(out).write_text(json.dumps({"grants": grants, "refused": refused}))


def run_processes(
    target: Any, redis_url: str, name: str, limit: str, burst: int, seconds: float, tmp_path: Path
) -> tuple[float, float, list[Any]]:
    """``PROCESSES`` forked children running ``target`` over one shared window."""
    ctx = fork_context()
    start = time.time() + 0.3  # (forking and connecting take well under that)
    end = start + seconds
    outs = [tmp_path / f"{i}.json" for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=target, args=(redis_url, name, limit, burst, start, end, str(out)))
        for out in outs
    ]
    with running(procs):
        for p in procs:
            p.join(seconds + 30)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    return start, end, [json.loads(out.read_text()) for out in outs]


@pytest.mark.slow
def test_four_processes_blocking_share_one_limit_exactly(
    r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    RateLimiter(r, "warm-up", 1).acquire()  # the script loaded once, before the clock starts
    start, end, per_process = run_processes(
        acquire_until, redis_url, "shared", f"{RATE}/s", BURST, SECONDS, tmp_path
    )
    grants = sorted(t for times in per_process for t in times)
    inside = [t for t in grants if start <= t < end]
    busiest = busiest_window(grants)
    report(
        "rate limiter, 4 processes blocking",
        granted=len(inside),
        ideal=int(RATE * SECONDS),
        busiest_1s=busiest,
        per_process=[len(times) for times in per_process],
    )
    # Every start of the window was used, and none beyond it: 150 slots, one 20 ms apart.
    assert RATE * SECONDS - 2 <= len(inside) <= RATE * SECONDS + 2
    assert busiest <= RATE + BURST, f"{busiest} starts in one second"
    # Each process had its share: the limit hands out slots in turn, it starves nobody.
    assert all(len(times) >= 20 for times in per_process), [len(t) for t in per_process]
    assert grants[0] - start < LATE  # the first start came at once


@pytest.mark.slow
def test_four_processes_hammering_non_blocking_never_exceed_the_limit(
    r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    burst, seconds = 5, 1.5
    RateLimiter(r, "warm-up", 1).acquire()
    _, _, per_process = run_processes(
        hammer_until, redis_url, "hammered", f"{RATE}/s", burst, seconds, tmp_path
    )
    grants = sorted((tuple(g) for out in per_process for g in out["grants"]), key=lambda g: g[0])
    refused = sum(out["refused"] for out in per_process)
    # A grant happened on the server between its call and its return: a set of
    # grants whose calls and returns all fit in one second surely started in it.
    surely_within = max(
        sum(1 for called, returned in grants[i:] if returned < grants[i][0] + 1.0)
        for i in range(len(grants))
    )
    span = max(returned for _, returned in grants) - min(called for called, _ in grants)
    report(
        "rate limiter, 4 processes hammering",
        granted=len(grants),
        refused=refused,
        surely_within_1s=surely_within,
        span=span,
    )
    assert refused > 10 * len(grants)  # they did hammer
    assert surely_within <= RATE + burst
    # Over the whole run, the burst and then one start per interval, and no more.
    assert len(grants) <= int(span * RATE) + burst
    assert len(grants) >= int(seconds * RATE) + burst - 3
