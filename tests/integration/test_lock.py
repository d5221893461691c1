"""Lock against a real redis-server: exclusion, crash recovery, renewal, wakeups, fencing.

Timings use time.monotonic(), which on Linux is CLOCK_MONOTONIC and so comparable
across the processes of one machine.  Round trips are counted client-side with
tests.helpers.counting_client, never inferred from timings.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from celery_redislock import (
    BackendUnavailable,
    ConfigurationError,
    Lock,
    LockContended,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
    ReadWriteLock,
    Semaphore,
)
from celery_redislock.primitives import _keeper as renewal
from celery_redislock.primitives import keys, reap, scripts
from celery_redislock.primitives.protocol import GRACE_MS
from tests.helpers import (
    Attempt,
    Command,
    RoundTrips,
    TcpProxy,
    assert_rising,
    blocked_clients,
    counting_client,
    fork_context,
    forking,
    keys_of,
    kill_now,
    outputs,
    race,
    running,
    server_ms,
    sha,
    wait_until,
)
from tests.redis_server import RedisServer, free_port

RENEWAL_THREAD = "redislock-keeper"
RENEWER_THREAD = "redislock-renew"

pytestmark = pytest.mark.usefixtures("no_leaked_leases")


# -- fixtures and helpers ------------------------------------------------------


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test alone, free to be killed."""
    server = RedisServer().start()
    yield server
    server.stop()


def is_script(command: Command, name: str) -> bool:
    return command[0].upper() == b"EVALSHA" and command[1] == sha(name)


def renewal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == RENEWAL_THREAD]


#: How long the fence key is kept after a grant (the default retention).
KEEP_MS = 600_000


def enqueue(r: redis.Redis, k: keys.LockKeys, token: str, ttl_ms: int, wait_ms: int) -> Any:
    """Queue a waiter (or grant it the lock) with one raw call of the acquire script.

    Returns the script's reply: the fence when granted, ``[0, holder's
    remaining ms, holder token, ...]`` when not.
    """
    return scripts.get("lock_acquire")(  # type: ignore[no-any-return]
        keys=k.script_keys, args=[token, ttl_ms, wait_ms, k.wake, GRACE_MS, KEEP_MS], client=r
    )


def hold_and_sample(lock: Lock, observer: redis.Redis, seconds: float) -> tuple[list[bool], int]:
    """Sample ``lock.owned()`` and the key's PTTL for ``seconds``: (owned flags, min PTTL)."""
    owned, pttls = [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        owned.append(lock.owned())
        pttls.append(observer.pttl(lock.key))
        time.sleep(0.03)
    return owned, min(pttls)


# -- 1. no overlap ---------------------------------------------------------------

HAMMER_PROCESSES = 50
HAMMER_CYCLES = 3


def _hammer(url: str, name: str, go: Any, out: str) -> None:
    client = redis.Redis.from_url(url)
    lock = Lock(client, name, ttl=10.0)
    if not go.wait(30):
        raise RuntimeError("never told to go")
    records = []
    for _ in range(HAMMER_CYCLES):
        asked = time.monotonic()
        if not lock.acquire(timeout=30):
            raise RuntimeError("acquire timed out")
        start = time.monotonic()
        fence = lock.fence
        time.sleep(0.001)
        end = time.monotonic()
        lock.release()
        records.append((asked, start, end, fence))
    Path(out).write_text(json.dumps(records))
    client.close()


def test_no_two_holders_overlap_across_50_processes(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    exitcodes = race(_hammer, [(redis_url, "hammer")] * HAMMER_PROCESSES, tmp_path)
    assert exitcodes == [0] * HAMMER_PROCESSES

    records = sorted(
        (rec for recs in outputs(tmp_path, HAMMER_PROCESSES) for rec in recs),
        key=lambda rec: rec[1],
    )
    assert len(records) == HAMMER_PROCESSES * HAMMER_CYCLES
    overlaps = [(a, b) for a, b in zip(records, records[1:]) if b[1] <= a[2]]
    assert overlaps == []
    # One grant per section, fences strictly increasing in the order the sections ran.
    fences = [rec[3] for rec in records]
    assert_rising(fences)
    # The lock was really contended: most callers asked while someone else held it.
    contended = sum(1 for a, b in zip(records, records[1:]) if b[0] < a[2])
    assert contended >= len(records) // 2
    k = keys.lock_keys("redislock", "hammer")
    assert r.exists(k.lock, k.queue, k.meta) == 0
    assert r.get(k.fence) == str(fences[-1]).encode()


# -- 2. crash ------------------------------------------------------------------------


def _hold_until_killed(url: str, name: str, ttl: float, conn: Any) -> None:
    lock = Lock(redis.Redis.from_url(url), name, ttl=ttl)
    lock.acquire()
    conn.send((lock.token, lock.fence))
    time.sleep(60)


@pytest.mark.fault
def test_crashed_holder_costs_at_most_its_lease(redis_url: str, r: redis.Redis) -> None:
    ttl = 1.0
    ctx = fork_context()
    parent_end, child_end = ctx.Pipe()
    holder = ctx.Process(target=_hold_until_killed, args=(redis_url, "crash", ttl, child_end))
    waiter = Lock(r, "crash", ttl=5.0)
    granted = Attempt(waiter, timeout=5)
    with running([holder]):
        assert parent_end.poll(10)
        _, holder_fence = parent_end.recv()
        granted.start()
        wait_until(lambda: blocked_clients(r) == 1, 2, what="the waiter to block")
        killed_at = kill_now(holder)
        pttl = r.pttl(waiter.key)
        granted.join(5)
    expires_at = killed_at + pttl / 1000
    assert pttl > 500  # the dead holder's lease was still running
    assert granted.ok is True
    # Not while the dead holder's lease was valid, and soon after it ran out.
    assert granted.at >= expires_at - 0.02
    assert granted.at - killed_at <= ttl + 0.5
    assert waiter.fence > holder_fence  # type: ignore[operator]
    assert r.get(waiter.key) == waiter.token.encode()  # type: ignore[union-attr]
    waiter.release()


# -- 3. renewal ------------------------------------------------------------------------


def test_renewal_keeps_the_lock_for_many_leases_and_stops_after_release(
    redis_url: str, r: redis.Redis
) -> None:
    client, trips = counting_client(redis_url)
    lock = Lock(client, "renewed", ttl=0.6)
    assert lock.renew_interval == pytest.approx(0.2)
    k = renewal.keeper()
    before = k.round_trips
    assert lock.acquire(blocking=False)
    owned, min_pttl = hold_and_sample(lock, r, 2.0)  # more than 3 leases
    assert all(owned)
    assert len(owned) > 30
    # Unrenewed, the key would be gone after 0.6 s; renewed every 0.2 s it
    # never drops much below 0.4 s.
    assert min_pttl > 150
    assert 6 <= k.round_trips - before <= 12
    lock.release()

    assert r.exists(lock.key) == 0
    assert lock not in k.held()
    # A renewal the keeper sent just before the release may still be on the
    # wire (counted already, recorded by the client as it goes out): let it
    # come back, then nothing more goes out.
    time.sleep(0.05)
    trips.reset()
    after = k.round_trips
    time.sleep(0.7)
    assert k.round_trips == after
    assert trips.count == 0


def test_renewal_of_20_locks_is_one_round_trip_per_tick(redis_url: str, r: redis.Redis) -> None:
    client, trips = counting_client(redis_url)
    client.ping()  # open the connection
    locks = [Lock(client, f"many-{i}", ttl=0.6) for i in range(20)]
    for lock in locks:
        assert lock.acquire(blocking=False)
    client.ping()  # (the pool's connection is open before counting)
    k = renewal.keeper()
    before = k.round_trips
    trips.reset()
    lowest = 10_000
    deadline = time.monotonic() + 1.3
    while time.monotonic() < deadline:
        pipe = r.pipeline(transaction=False)
        for lock in locks:
            pipe.pttl(lock.key)
        lowest = min(lowest, *pipe.execute())
        time.sleep(0.02)
    # Snapshot just after a tick, so no renewal is in flight.
    ticked = k.round_trips
    wait_until(lambda: k.round_trips > ticked, 1, what="a renewal tick")
    time.sleep(0.05)
    ticks = k.round_trips - before
    sends = trips.sends
    for lock in locks:
        lock.release()

    assert 5 <= ticks <= 10
    # Nothing else used this client: every round trip was one whole tick.
    assert len(sends) == ticks
    for send in sends:
        assert len(send) == 20
        assert all(is_script(c, "lock_extend") for c in send)
        assert sorted(keys_of(send)) == sorted(lock.key.encode() for lock in locks)
    assert lowest > 150  # every lock's lease was refreshed every tick


def test_a_short_lease_taken_while_the_keeper_sleeps_long_is_renewed_in_time(
    redis_url: str, r: redis.Redis
) -> None:
    client, _ = counting_client(redis_url)
    slow = Lock(client, "renewed every 3 s", ttl=9.0)
    assert slow.acquire(blocking=False)
    k = renewal.keeper()
    wait_until(lambda: slow in k.held(), 1, what="the keeper to take the long lease")
    time.sleep(0.1)  # the keeper is asleep until the long lease's renewal
    fast = Lock(client, "renewed every 0.1 s", ttl=0.3)
    assert fast.acquire(blocking=False)
    owned, min_pttl = hold_and_sample(fast, r, 1.0)  # more than 3 of its leases
    fast.release()
    slow.release()

    assert all(owned)
    assert min_pttl > 100


def test_a_lease_released_before_the_keeper_takes_it_is_never_renewed(
    redis_url: str, r: redis.Redis
) -> None:
    client, trips = counting_client(redis_url)
    lock = Lock(client, "short holds", ttl=0.3)
    k = renewal.keeper()
    for _ in range(50):
        assert lock.acquire(blocking=False)
        lock.release()
    trips.reset()
    before = k.round_trips
    time.sleep(0.4)  # past every one of those leases' first renewal

    assert k.tokens() == []
    assert k.round_trips == before
    assert trips.count == 0


# -- 4. round trips --------------------------------------------------------------------


def test_uncontended_acquire_and_release_are_one_round_trip_each(redis_url: str) -> None:
    client, trips = counting_client(redis_url)
    warm = Lock(client, "warm-up", ttl=5.0)
    warm.acquire()
    warm.release()  # scripts loaded, connection open and handshaken

    lock = Lock(client, "one-trip", ttl=5.0)
    trips.reset()
    assert lock.acquire()
    assert trips.count == 1
    assert is_script(trips.sends[0][0], "lock_acquire")

    trips.reset()
    lock.release()
    assert trips.count == 1
    assert is_script(trips.sends[0][0], "lock_release")

    holder = Lock(client, "one-trip", ttl=5.0)
    holder.acquire()
    trips.reset()
    assert lock.acquire(blocking=False) is False  # contended, non-blocking: one ask
    assert trips.names() == [["EVALSHA"]]
    holder.release()


def test_blocked_waiter_woken_by_release_makes_two_round_trips(
    redis_url: str, r: redis.Redis
) -> None:
    holder = Lock(r, "woken", ttl=10.0)
    client, trips = counting_client(redis_url)
    client.ping()  # the connection is open; the scripts are already loaded
    waiter = Lock(client, "woken", ttl=10.0)
    result: list[bool] = []

    def wait_in_a_thread() -> None:
        holder.acquire()
        thread = threading.Thread(target=lambda: result.append(waiter.acquire(timeout=10)))
        thread.start()
        wait_until(lambda: blocked_clients(r) == 1, 2, what="the waiter to block")
        holder.release()
        thread.join(5)
        waiter.release()

    # The first wait opens the thread's own wait connection (its handshake is
    # counted too); the second is what every later wait costs.
    trips.reset()
    wait_in_a_thread()
    handshake = trips.names()
    assert [send for send in handshake if send[0] in ("EVALSHA", "BLPOP")] == [
        ["EVALSHA"],
        ["BLPOP"],
        ["EVALSHA"],
    ]
    trips.reset()
    wait_in_a_thread()
    assert result == [True, True]
    assert trips.names() == [["EVALSHA"], ["BLPOP"], ["EVALSHA"]]
    assert is_script(trips.sends[0][0], "lock_acquire")
    assert is_script(trips.sends[2][0], "lock_release")


def test_release_without_acquire_raises_lock_not_owned_without_a_round_trip(
    redis_url: str,
) -> None:
    client, trips = counting_client(redis_url)
    lock = Lock(client, "never-held", ttl=1.0)
    with pytest.raises(LockNotOwned) as exc_info:
        lock.release()
    assert type(exc_info.value) is LockNotOwned
    assert exc_info.value.key == lock.key
    with pytest.raises(LockNotOwned):
        lock.extend()
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(blocking=False, timeout=1)
    assert trips.count == 0


# -- 5. wakeup and FIFO -------------------------------------------------------------------


def _wait_and_report(url: str, name: str, conn: Any) -> None:
    lock = Lock(redis.Redis.from_url(url), name, ttl=10.0, owner="proc-waiter-")
    ok = lock.acquire(timeout=10)
    conn.send((ok, time.monotonic(), lock.fence))
    lock.release()


def test_waiter_in_another_process_gets_the_lock_within_50ms_of_release(
    redis_url: str, r: redis.Redis
) -> None:
    holder = Lock(r, "wakeup", ttl=10.0)
    holder.acquire()
    fence = holder.fence
    ctx = fork_context()
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=_wait_and_report, args=(redis_url, "wakeup", child_end))
    with running([proc]):
        wait_until(lambda: blocked_clients(r) == 1, 5, what="the waiter to block")
        assert r.zrange(holder.keys.queue, 0, -1)[0].startswith(b"proc-waiter-")
        released_at = time.monotonic()
        holder.release()
        assert parent_end.poll(5)
        ok, granted_at, waiter_fence = parent_end.recv()
        proc.join(5)
    assert proc.exitcode == 0
    assert ok is True
    assert 0 <= granted_at - released_at < 0.05
    assert waiter_fence > fence  # type: ignore[operator]


def test_waiters_get_the_lock_in_arrival_order(r: redis.Redis) -> None:
    holder = Lock(r, "fifo", ttl=10.0)
    holder.acquire()
    first_fence = holder.fence
    queue = holder.keys.queue
    grants: list[tuple[int, int]] = []

    def waiter(i: int) -> None:
        lock = Lock(r, "fifo", ttl=10.0, owner=f"w{i}-")
        if lock.acquire(timeout=10):
            grants.append((i, lock.fence))  # type: ignore[arg-type]
            time.sleep(0.01)
            lock.release()

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(1, 6)]
    for i, thread in enumerate(threads, 1):
        thread.start()
        wait_until(lambda i=i: r.zcard(queue) == i, 2, what=f"waiter {i} to queue")
        time.sleep(0.05)  # arrival scores are in ms: keep arrivals well apart
    arrived = [m.decode().split("-")[0] for m in r.zrange(queue, 0, -1)]
    assert arrived == ["w1", "w2", "w3", "w4", "w5"]
    holder.release()
    for thread in threads:
        thread.join(10)
    assert [i for i, _ in grants] == [1, 2, 3, 4, 5]
    assert_rising([first_fence, *(f for _, f in grants)])


def test_retried_ask_keeps_a_waiters_place_in_line(r: redis.Redis) -> None:
    holder = Lock(r, "line", ttl=10.0, renew=False)
    holder.acquire()
    k = holder.keys
    assert enqueue(r, k, "first", 5000, 5000)[0] == 0
    time.sleep(0.005)
    assert enqueue(r, k, "second", 5000, 5000)[0] == 0
    time.sleep(0.005)
    assert enqueue(r, k, "first", 5000, 5000)[0] == 0  # asks again (a wakeup, a retry)
    assert r.zrange(k.queue, 0, -1) == [b"first", b"second"]
    holder.release()
    assert r.get(k.lock) == b"first"


def test_newcomer_does_not_barge_past_a_queued_waiter_on_release(r: redis.Redis) -> None:
    holder = Lock(r, "barge", ttl=10.0)
    holder.acquire()
    fence = holder.fence
    waiter = Lock(r, "barge", ttl=10.0, owner="waiter-")
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(waiter.acquire(timeout=10)))
    thread.start()
    wait_until(lambda: blocked_clients(r) == 1, 2, what="the waiter to block")
    holder.release()
    newcomer = Lock(r, "barge", ttl=10.0)
    assert newcomer.acquire(blocking=False) is False
    assert newcomer.holder is not None and newcomer.holder.startswith("waiter-")
    thread.join(5)
    assert result == [True]
    assert waiter.fence > fence  # type: ignore[operator]
    waiter.release()


@pytest.mark.parametrize("first", ["gone", "live"])
def test_release_hands_over_to_the_first_live_waiter(r: redis.Redis, first: str) -> None:
    """A release grants the first waiter still waiting (fence, lease and
    wake-up), passing over one whose wait has lapsed."""
    holder = Lock(r, "first-live", ttl=10.0)
    assert holder.acquire()
    gone = Lock(r, "first-live", ttl=10.0)
    gone_token = gone._new_token()
    live = Lock(r, "first-live", ttl=7.0)
    live_token = live._new_token()
    # Queued without blocking: the gone one gave up 1 ms after it queued.
    order = [(gone, gone_token, 1), (live, live_token, 5000)]
    for lock, token, wait_ms in order if first == "gone" else order[::-1]:
        assert lock._attempt(token, wait_ms) == 0
    time.sleep(0.01)
    before = holder.fence
    holder.release()
    assert r.get(holder.key) == live_token.encode()
    assert 6000 < r.pttl(holder.key) <= 7000  # the waiter's own lease
    fence, _, granted_ms = r.lpop(live.keys.wake + live_token).partition(b":")  # type: ignore[union-attr]
    assert int(fence) > before  # type: ignore[operator]
    assert int(fence) == int(r.get(live.keys.fence))  # type: ignore[arg-type]
    assert abs(int(granted_ms) - server_ms(r)) < 1000
    assert r.exists(gone.keys.wake + gone_token) == 0
    expected_left = 1 if first == "live" else 0  # (the lapsed one, dropped by a later call)
    assert r.zcard(live.keys.queue) == expected_left
    r.delete(holder.key, live.keys.queue, live.keys.meta)


def test_newcomer_does_not_barge_when_the_holders_lease_runs_out(r: redis.Redis) -> None:
    # A known fault of polling locks (python-redis-lock's among them): when the
    # lock frees up with nobody releasing it, the next caller must not jump the queue.
    holder = Lock(r, "expiring", ttl=0.2, renew=False)
    holder.acquire()
    fence = holder.fence
    k = holder.keys
    assert enqueue(r, k, "queued-waiter", 10_000, 5000)[0] == 0
    wait_until(lambda: r.exists(k.lock) == 0, 1, what="the lease to run out")
    newcomer = Lock(r, "expiring", ttl=10.0, renew=False)
    assert newcomer.acquire(blocking=False) is False
    assert newcomer.holder == "queued-waiter"
    assert r.get(k.lock) == b"queued-waiter"
    # The waiter's wake list carries its fence and the grant's server time,
    # as if a release had woken it.
    (pushed,) = r.lrange(k.wake + "queued-waiter", 0, -1)
    pushed_fence, granted_ms = pushed.split(b":")
    assert int(pushed_fence) > fence  # type: ignore[operator]
    assert r.get(k.fence) == pushed_fence
    assert abs(int(granted_ms) - server_ms(r)) < 2000
    assert r.zcard(k.queue) == 0


def test_acquire_timeout_gives_up_and_leaves_the_queue(r: redis.Redis) -> None:
    holder = Lock(r, "patience", ttl=10.0, owner="holder-")
    holder.acquire()
    lock = Lock(r, "patience", ttl=10.0)
    started = time.monotonic()
    assert lock.acquire(timeout=0.2) is False
    assert 0.2 <= time.monotonic() - started < 1.0
    assert lock.token is None
    assert lock.holder == holder.token
    assert r.exists(lock.keys.queue, lock.keys.meta) == 0
    holder.release()
    assert r.exists(holder.key) == 0  # nobody was left in line to hand it to


# -- 6. fencing ----------------------------------------------------------------------------


def test_fences_increase_across_holders_expiry_and_takeover(r: redis.Redis) -> None:
    fences = []
    for _ in range(3):
        lock = Lock(r, "fenced", ttl=5.0)
        lock.acquire()
        fences.append(lock.fence)
        lock.release()
    expired = Lock(r, "fenced", ttl=0.1, renew=False)
    expired.acquire()
    fences.append(expired.fence)
    wait_until(lambda: r.exists(expired.key) == 0, 1, what="the lease to run out")
    taker = Lock(r, "fenced", ttl=5.0)
    assert taker.acquire(blocking=False)
    fences.append(taker.fence)
    assert_rising(fences)
    # The fence key is kept for the retention after the last grant, then goes.
    assert 590_000 < r.pttl(taker.keys.fence) <= 600_000
    other = Lock(r, "another name", ttl=5.0)
    other.acquire()
    assert other.fence is not None and r.get(other.keys.fence) == str(other.fence).encode()
    other.release()
    taker.release()
    with pytest.raises(LockLost):
        expired.release()


# -- 7. safe release, extend, loss -----------------------------------------------------------


def test_release_after_takeover_raises_lock_lost_and_keeps_the_new_holder(
    r: redis.Redis,
) -> None:
    a = Lock(r, "taken", ttl=0.15, renew=False)
    a.acquire()
    a_fence = a.fence
    wait_until(lambda: r.exists(a.key) == 0, 1, what="the lease to run out")
    b = Lock(r, "taken", ttl=5.0, renew=False)
    assert b.acquire(blocking=False)
    with pytest.raises(LockLost) as exc_info:
        a.release()
    assert exc_info.value.key == a.key
    assert f"fence {a_fence}" in str(exc_info.value)
    assert a.lost is True
    assert a.token is None
    assert r.get(b.key) == b.token.encode()  # type: ignore[union-attr]
    assert r.pttl(b.key) > 4000
    assert b.owned()
    b.release()


def test_extend_resets_the_lease(r: redis.Redis) -> None:
    lock = Lock(r, "extended", ttl=1.0, renew=False)
    lock.acquire()
    lock.extend(5)
    assert 4900 < r.pttl(lock.key) <= 5000
    lock.extend()
    assert 900 < r.pttl(lock.key) <= 1000
    with pytest.raises(ConfigurationError, match="-1"):
        lock.extend(-1)
    lock.release()


def test_extend_of_an_expired_lock_raises_lock_lost(
    r: redis.Redis, lost_events: list[tuple[Any, str]]
) -> None:
    reasons: list[str] = []
    lock = Lock(r, "too late", ttl=0.1, renew=False, on_lost=lambda _, why: reasons.append(why))
    lock.acquire()
    wait_until(lambda: r.exists(lock.key) == 0, 1, what="the lease to run out")
    with pytest.raises(LockLost):
        lock.extend()
    assert lock.lost is True
    assert lock.token is None
    assert len(reasons) == 1
    assert [lease for lease, _ in lost_events] == [lock]


@pytest.mark.parametrize("intruder", [None, "someone-else"], ids=["deleted", "overwritten"])
def test_renewal_that_finds_the_lease_gone_marks_it_lost(
    r: redis.Redis, lost_events: list[tuple[Any, str]], intruder: str | None
) -> None:
    calls: list[tuple[Lock, str]] = []
    lock = Lock(r, "vanishing", ttl=0.6, on_lost=lambda lk, why: calls.append((lk, why)))
    lock.acquire()
    started = time.monotonic()
    if intruder is None:
        r.delete(lock.key)
    else:
        r.set(lock.key, intruder, px=5000)
    wait_until(lambda: lock.lost, 1, what="renewal to notice")
    assert time.monotonic() - started < lock.renew_interval + 0.2
    # ``lost`` turns true first; the callback and the listeners are called
    # right after, on the keeper's thread.
    wait_until(lambda: calls and lost_events, 1, what="the lost-lease listeners")
    assert [lk for lk, _ in calls] == [lock]
    assert [lease for lease, _ in lost_events] == [lock]
    assert "expired" in calls[0][1]
    assert lock not in renewal.keeper().held()
    assert not lock.owned()
    if intruder is not None:  # renewal did not touch the new value or its lease
        assert r.get(lock.key) == intruder.encode()
        assert r.pttl(lock.key) > 4000
    with pytest.raises(LockLost):
        lock.release()


def test_reap_releases_only_the_named_owners_lock(r: redis.Redis) -> None:
    holder = Lock(r, "reaped", ttl=10.0, owner="child-7:", renew=False)
    holder.acquire()
    fence = holder.fence
    assert enqueue(r, holder.keys, "next-in-line", 5000, 5000)[0] == 0
    assert reap(r, "reaped", "child-8:") is False
    assert r.get(holder.key) == holder.token.encode()  # type: ignore[union-attr]
    assert reap(r, "reaped", "child-7:") is True
    assert r.get(holder.key) == b"next-in-line"  # handed on, as a release does
    assert int(r.get(holder.keys.fence)) > fence  # type: ignore[arg-type, operator]


def test_locked_owned_and_no_reentry(r: redis.Redis) -> None:
    lock = Lock(r, "inspect", ttl=5.0)
    other = Lock(r, "inspect", ttl=5.0)
    assert not lock.locked() and not lock.owned()
    lock.acquire()
    assert lock.locked() and other.locked()
    assert lock.owned() and not other.owned()
    with pytest.raises(LockError, match="already held"):
        lock.acquire(blocking=False)
    assert lock.owned()  # the failed re-entry did not disturb the hold
    lock.release()
    assert not lock.locked()


# -- 8. retried acquire --------------------------------------------------------------------


def test_retried_acquire_with_the_same_token_is_granted_again(r: redis.Redis) -> None:
    # The reply to a successful acquire was lost; the caller retries with its token.
    k = keys.lock_keys("redislock", "retried")
    first = enqueue(r, k, "token-1", 5000, 0)
    r.pexpire(k.lock, 1000)
    second = enqueue(r, k, "token-1", 5000, 0)
    # Held, confirmed with a fence of its own: higher, and the name's last.
    assert isinstance(first, int) and isinstance(second, int) and second > first
    assert r.get(k.fence) == str(second).encode()
    assert r.get(k.lock) == b"token-1"
    assert r.pttl(k.lock) > 4000  # the retry restored the full lease
    third = enqueue(r, k, "token-2", 5000, 0)
    assert third[0] == 0 and third[2] == b"token-1"


# -- 9. bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [0, -1, 0.0, float("nan"), float("inf"), "10", None, True])
def test_bad_ttl_raises_configuration_error_naming_the_value(r: redis.Redis, ttl: Any) -> None:
    with pytest.raises(ConfigurationError) as exc_info:
        Lock(r, "n", ttl=ttl)
    assert repr(ttl) in str(exc_info.value)
    assert "ttl" in str(exc_info.value)


@pytest.mark.parametrize("name", ["", None, 7, b"bytes", ["list"]])
def test_bad_name_raises_configuration_error_naming_the_value(r: redis.Redis, name: Any) -> None:
    with pytest.raises(ConfigurationError) as exc_info:
        Lock(r, name, ttl=1.0)
    assert repr(name) in str(exc_info.value)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("renew_interval", 1.0),
        ("renew_interval", 2.5),
        ("renew_interval", 0),
        ("renew_interval", "0.1"),
        ("timeout", -1),
        ("timeout", "5"),
        ("prefix", ""),
        ("prefix", 3),
    ],
)
def test_bad_option_raises_configuration_error_naming_the_value(
    r: redis.Redis, option: str, value: Any
) -> None:
    with pytest.raises(ConfigurationError) as exc_info:
        Lock(r, "n", ttl=1.0, **{option: value})
    assert repr(value) in str(exc_info.value)
    assert isinstance(exc_info.value, ValueError)


def test_bad_acquire_arguments(r: redis.Redis) -> None:
    lock = Lock(r, "args", ttl=1.0)
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(ConfigurationError, match="-2"):
        lock.acquire(timeout=-2)
    assert r.keys("*") == []


def test_with_lock_timing_out_raises_lock_timeout_with_the_facts(r: redis.Redis) -> None:
    holder = Lock(r, "busy", ttl=10.0, owner="holder-")
    holder.acquire()
    lock = Lock(r, "busy", ttl=10.0, timeout=0.2)
    entered = False
    started = time.monotonic()
    with pytest.raises(LockTimeout) as exc_info, lock:
        entered = True
    elapsed = time.monotonic() - started
    exc = exc_info.value
    assert not entered
    assert isinstance(exc, LockContended) and isinstance(exc, LockError)
    assert exc.key == lock.key
    assert exc.holder == holder.token
    assert exc.ttl_ms is not None and 8000 < exc.ttl_ms <= 10_000
    assert holder.token in str(exc)  # type: ignore[operator]
    assert 0.2 <= elapsed < 1.0
    assert r.exists(lock.keys.queue, lock.keys.meta) == 0
    holder.release()


# -- 10. Redis unreachable ----------------------------------------------------------------------


@pytest.mark.fault
def test_acquire_with_redis_unreachable_raises_backend_unavailable() -> None:
    # from_url: redis.Redis(host=..., port=...) would retry 10 times with backoff
    # (redis-py 8 defaults), seconds per call; the pool from a URL fails at once.
    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")  # nobody listens
    lock = Lock(client, "nowhere", ttl=1.0)
    for blocking in (False, True):
        with pytest.raises(BackendUnavailable) as exc_info:
            lock.acquire(blocking=blocking)
        assert isinstance(exc_info.value.__cause__, redis.ConnectionError)
        assert lock.key in str(exc_info.value)
    assert lock.token is None
    with pytest.raises(BackendUnavailable):
        lock.locked()


@pytest.mark.fault
def test_release_and_extend_with_redis_down_raise_backend_unavailable(
    private_redis: RedisServer,
) -> None:
    lock = Lock(redis.Redis.from_url(private_redis.url), "stranded", ttl=10.0)
    lock.acquire()
    private_redis.kill()
    with pytest.raises(BackendUnavailable) as exc_info:
        lock.extend()
    assert isinstance(exc_info.value.__cause__, redis.ConnectionError)
    with pytest.raises(BackendUnavailable):
        lock.owned()
    with pytest.raises(BackendUnavailable) as exc_info:
        lock.release()
    assert isinstance(exc_info.value.__cause__, redis.ConnectionError)
    assert lock not in renewal.keeper().held()


@pytest.mark.fault
def test_renewal_with_redis_down_marks_the_lease_lost_and_the_keeper_survives(
    private_redis: RedisServer, lost_events: list[tuple[Any, str]]
) -> None:
    client = redis.Redis.from_url(private_redis.url)
    lost_at: list[float] = []
    lock = Lock(client, "down", ttl=1.0, on_lost=lambda *_: lost_at.append(time.monotonic()))
    lock.acquire()
    k = renewal.keeper()
    threads = renewal_threads()
    assert len(threads) == 1
    # Kill Redis just after a good renewal, so the lease's end is known.
    ticked = k.round_trips
    wait_until(lambda: k.round_trips > ticked, 1, what="a renewal tick")
    time.sleep(0.02)
    private_redis.kill()
    killed_at = time.monotonic()
    # (``lost`` turns true first; the callback and listeners right after.)
    wait_until(lambda: lock.lost and lost_at and lost_events, 3, what="the lease marked lost")
    assert len(lost_at) == 1
    # Lost once the lease has run out (not before), within one renewal interval.
    assert lock.ttl - 0.1 <= lost_at[0] - killed_at <= lock.ttl + lock.renew_interval + 0.3
    assert [lease for lease, _ in lost_events] == [lock]
    assert "unreachable" in lost_events[0][1]
    assert lock not in k.held()

    private_redis.start()  # same port, empty, no scripts loaded
    fresh = Lock(client, "after restart", ttl=0.6)
    assert fresh.acquire(blocking=False)
    owned, min_pttl = hold_and_sample(fresh, client, 1.5)
    assert all(owned)
    assert min_pttl > 150
    assert renewal_threads() == threads  # the same keeper thread, alive
    fresh.release()
    with pytest.raises(LockLost):
        lock.release()


# -- 11. names ---------------------------------------------------------------------------------

NAMES = [
    pytest.param("plain", id="plain"),
    pytest.param("a{b}c", id="braces"),
    pytest.param("{", id="open-brace"),
    pytest.param("}{", id="reversed-braces"),
    pytest.param("{}", id="empty-braces"),
    pytest.param("#hash", id="hash"),
    pytest.param("ünïcødé ✓ 日本語", id="unicode"),
    pytest.param("nul\x00 newline\n tab\t", id="control"),
    pytest.param("x" * 10_000, id="10KB"),
    pytest.param("é" * 6000, id="12KB-utf8"),
]


@pytest.mark.parametrize("name", NAMES)
def test_any_name_works_and_all_its_keys_share_one_slot(r: redis.Redis, name: str) -> None:
    lock = Lock(r, name, ttl=5.0, renew=False)
    other = Lock(r, name, ttl=5.0, renew=False)
    assert lock.acquire(blocking=False)
    assert other.acquire(blocking=False) is False
    assert other.holder == lock.token
    assert enqueue(r, lock.keys, "waiter", 5000, 5000)[0] == 0
    stored = set(r.keys("*"))  # lock, fence, queue, meta
    lock.release()  # hands the lock to the waiter: its wake list appears
    stored |= set(r.keys("*"))
    assert r.get(lock.key) == b"waiter"
    assert len(stored) == 5
    assert len({key_slot(key) for key in stored}) == 1
    assert max(len(key) for key in stored) < 300


def test_distinct_names_are_distinct_locks(r: redis.Redis) -> None:
    locks = [Lock(r, p.values[0], ttl=5.0, renew=False) for p in NAMES]
    assert all(lock.acquire(blocking=False) for lock in locks)
    assert len(set(r.keys("*:lock"))) == len(NAMES)
    for lock in locks:
        lock.release()


# -- 12. fork ------------------------------------------------------------------------------------


def _in_forked_child(client: redis.Redis, parent_pid: int) -> dict[str, Any]:
    k = renewal.keeper()
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "keeper_pid": k.pid,
        "inherited_held": len(k.held()),
    }
    lock = Lock(client, "fork-child", ttl=0.6)  # the client came from the parent
    before = k.round_trips
    lock.acquire()
    owned, min_pttl = hold_and_sample(lock, client, 1.5)
    report.update(
        all_owned=all(owned),
        min_pttl=min_pttl,
        round_trips=k.round_trips - before,
        same_keeper=renewal.keeper() is k,
        renewal_threads=len(renewal_threads()),
    )
    lock.release()
    return report


def test_forked_child_gets_its_own_keeper_that_renews(r: redis.Redis) -> None:
    parent_lock = Lock(r, "fork-parent", ttl=0.6)
    parent_lock.acquire()
    parent_keeper = renewal.keeper()
    assert parent_keeper.held() == [parent_lock]
    parent_pid = os.getpid()
    read_fd, write_fd = os.pipe()
    with forking():
        pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        status, report = 1, {}
        try:
            os.close(read_fd)
            report = _in_forked_child(r, parent_pid)
            status = 0
        except BaseException:
            report = {"error": traceback.format_exc()}
        finally:
            with contextlib.suppress(BaseException):
                os.write(write_fd, json.dumps(report).encode())
            os._exit(status)

    os.close(write_fd)
    try:
        owned, parent_min_pttl = hold_and_sample(parent_lock, r, 1.0)
        deadline = time.monotonic() + 10
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            assert time.monotonic() < deadline, "the child did not finish"
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as pipe:
        report = json.loads(pipe.read() or b"{}")
    assert "error" not in report, report.get("error")
    assert report["pid"] != parent_pid
    assert report["keeper_pid"] == report["pid"]  # a new keeper, not the parent's
    assert report["inherited_held"] == 0  # it does not renew the parent's locks
    assert report["same_keeper"] is True
    assert report["renewal_threads"] == 1
    assert report["all_owned"] is True
    assert report["min_pttl"] > 150  # the child's lock outlived 2 leases: renewed
    assert report["round_trips"] >= 5
    # The parent's keeper kept renewing through the fork.
    assert renewal.keeper() is parent_keeper
    assert all(owned) and parent_min_pttl > 150
    parent_lock.release()


# -- races and partitions (bugs found while writing these tests, now fixed) --------------------


@contextlib.contextmanager
def renewal_held_before_sending(
    trips: RoundTrips,
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold the keeper's first renewal send until ``gate`` is set; ``entered`` says it is held.

    Only the timing changes: the keeper has built its EVALSHAs (with the token it
    read) and waits just before writing them to the socket.
    """
    entered, gate = threading.Event(), threading.Event()

    def hook(commands: list[Command]) -> None:
        if (
            threading.current_thread().name == RENEWER_THREAD
            and not entered.is_set()
            and any(is_script(c, "lock_extend") for c in commands)
        ):
            entered.set()
            gate.wait(5)

    trips.before_send = hook
    try:
        yield entered, gate
    finally:
        gate.set()
        trips.before_send = None


def test_release_during_an_inflight_renewal_is_not_reported_lost(
    redis_url: str, lost_events: list[tuple[Any, str]]
) -> None:
    client, trips = counting_client(redis_url)
    lock = Lock(client, "race-release", ttl=0.6)
    with renewal_held_before_sending(trips) as (entered, gate):
        lock.acquire()
        assert entered.wait(2)
        lock.release()
        gate.set()
        wait_until(
            lambda: any(is_script(c, "lock_extend") for send in trips.sends for c in send),
            2,
            what="the held renewal to go out",
        )
        time.sleep(0.1)  # the keeper reads the reply
    assert lost_events == []
    assert lock.lost is False


def test_reacquire_during_an_inflight_renewal_keeps_the_new_hold_renewed(
    redis_url: str, r: redis.Redis
) -> None:
    client, trips = counting_client(redis_url)
    lock = Lock(client, "race-reacquire", ttl=0.6)
    try:
        with renewal_held_before_sending(trips) as (entered, gate):
            lock.acquire()
            assert entered.wait(2)
            lock.release()
            assert lock.acquire(blocking=False)
            token = lock.token
            gate.set()
        owned, min_pttl = hold_and_sample(lock, r, 1.3)
        assert all(owned) and min_pttl > 0
        assert r.get(lock.key) == token.encode()  # type: ignore[union-attr]
        assert lock.lost is False
    finally:
        with contextlib.suppress(LockError):
            lock.release()


@pytest.mark.fault
def test_renewal_marks_the_lease_lost_during_a_network_partition(
    r: redis.Redis, lost_events: list[tuple[Any, str]]
) -> None:
    kwargs = r.connection_pool.connection_kwargs
    with TcpProxy(kwargs["host"], kwargs["port"]) as proxy:
        lock = Lock(redis.Redis.from_url(proxy.url), "partitioned", ttl=0.6)
        lock.acquire()
        proxy.blackhole()
        try:
            wait_until(lambda: r.exists(lock.key) == 0, 2, what="the lease to run out")
            wait_until(lambda: lock.lost, lock.renew_interval + 0.3, what="the loss to be seen")
        finally:
            proxy.close()  # EOF unblocks the keeper
            wait_until(lambda: lock.lost, 5, what="the keeper to recover")
            with contextlib.suppress(LockError, BackendUnavailable):
                lock.release()


@pytest.mark.fault
def test_partition_of_one_client_does_not_stop_renewals_on_another(r: redis.Redis) -> None:
    kwargs = r.connection_pool.connection_kwargs
    with TcpProxy(kwargs["host"], kwargs["port"]) as proxy:
        cut = Lock(redis.Redis.from_url(proxy.url), "cut off", ttl=0.6)
        healthy = Lock(r, "healthy", ttl=0.6)
        cut.acquire()
        healthy.acquire()
        proxy.blackhole()
        try:
            owned, min_pttl = hold_and_sample(healthy, r, 1.5)
            assert all(owned) and min_pttl > 0
        finally:
            proxy.close()
            wait_until(lambda: cut.lost, 5, what="the keeper to recover")
            with contextlib.suppress(LockError, BackendUnavailable):
                cut.release()
            with contextlib.suppress(LockError):
                healthy.release()


def test_fifo_order_holds_within_one_millisecond(r: redis.Redis) -> None:
    acquire = scripts.get("lock_acquire")
    for n in range(5):  # each round ties with high probability; five make it certain
        holder = Lock(r, f"same-ms-{n}", ttl=10.0, renew=False)
        holder.acquire()
        k = holder.keys
        pipe = r.pipeline(transaction=True)
        for token in ("z-arrived-first", "a-arrived-second"):
            args = [token, 10_000, 10_000, k.wake, GRACE_MS, KEEP_MS]
            pipe.evalsha(acquire.sha, len(k.script_keys), *k.script_keys, *args)
        assert [reply[0] for reply in pipe.execute()] == [0, 0]
        assert r.zrange(k.queue, 0, -1) == [b"z-arrived-first", b"a-arrived-second"]


# -- 11. nothing left behind -----------------------------------------------------------------


def test_a_name_leaves_no_keys_once_its_holders_waiters_and_fence_retention_are_gone(
    r: redis.Redis,
) -> None:
    """Released, crashed and abandoned holds and waits all end with an empty database.

    (A fence is kept for the longer of fence_retention and the ttl after the
    name's last grant: 1 s each here, well inside the wait below.)"""
    r.flushdb()
    retention = 1.0
    opts: dict[str, Any] = {"fence_retention": retention}
    for i in range(50):  # released
        for prim in (
            Lock(r, f"gone-{i}", ttl=1.0, **opts),
            Semaphore(r, f"gone-{i}", 3, ttl=1.0, **opts),
            ReadWriteLock(r, f"gone-{i}", ttl=1.0, **opts).read(),
        ):
            assert prim.acquire(blocking=False)
            prim.release()
    # Crashed holders (never released, never renewed).
    crashed = [
        Lock(r, "crashed", ttl=0.5, renew=False, **opts),
        Semaphore(r, "crashed", 2, ttl=0.5, renew=False, **opts),
        ReadWriteLock(r, "crashed", ttl=0.5, renew=False, **opts).write(),
    ]
    for prim in crashed:
        assert prim.acquire(blocking=False)
    # A waiter that died in line behind the crashed lock, and one behind a
    # holder that then released (it was handed the lock, for its own lease).
    assert enqueue(r, crashed[0].keys, "dead-waiter-1", 300, 10_000)[0] == 0
    holder = Lock(r, "abandoned", ttl=1.0, **opts)
    assert holder.acquire()
    assert enqueue(r, holder.keys, "dead-waiter-2", 300, 300)[0] == 0
    holder.release()
    assert r.get(holder.key) == b"dead-waiter-2"
    # A contended semaphore acquire that stored the limit and gave up.
    full = Semaphore(r, "full", 1, ttl=1.0, **opts)
    assert full.acquire()
    assert Semaphore(r, "full", 1, ttl=1.0, **opts).acquire(timeout=0.1) is False
    full.release()
    assert r.dbsize() > 0
    fences = [k for k in r.scan_iter(match="*:fence")]
    assert {k for k in r.scan_iter()} - set(fences) != set()  # the crashed and the queued
    # Within the leases, grace and retention, everything goes by itself.
    wait_until(lambda: r.dbsize() == 0, 5, interval=0.1, what="every key to expire")


def _primitive(kind: str, client: redis.Redis, name: str) -> Lock | Semaphore:
    if kind == "lock":
        return Lock(client, name, ttl=5.0, renew=False)
    if kind == "semaphore":
        return Semaphore(client, name, limit=1, ttl=5.0, renew=False)
    return ReadWriteLock(client, name, ttl=5.0).write(renew=False)


@pytest.mark.parametrize("kind", ["lock", "semaphore", "write side"])
def test_a_late_confirmation_is_fenced_above_every_fence_handed_out_before_it(
    r: redis.Redis, private_redis: RedisServer, kind: str
) -> None:
    """A grant confirmed late (a retried call, or a wake-up read after a
    failover, asking again on the new master) gets a new fence: the one issued
    at grant time may be lower than fences handed out meanwhile, elsewhere.

    Two servers stand for the two masters of a split brain: the name is
    granted on one, then taken three times on the other, then the first grant
    is confirmed."""
    name = f"late-confirmation-{kind}"
    other = redis.Redis(port=private_redis.port)
    try:
        late = _primitive(kind, other, name)
        token = late._new_token()
        assert late._attempt(token, 0) == 1
        issued = late.fence
        elsewhere = []
        for _ in range(3):
            with _primitive(kind, r, name) as held:
                elsewhere.append(held.fence)
        late._token = None  # (as if the reply had never arrived)
        assert late._attempt(token, 0) == 1  # the same token asks again
        assert_rising([issued, *elsewhere, late.fence])
        late.release()
        assert other.exists(late.key) == 0
    finally:
        other.close()


@pytest.mark.parametrize("kind", ["lock", "semaphore", "write side"])
def test_fences_rise_past_a_last_fence_ahead_of_the_servers_clock(
    r: redis.Redis, kind: str
) -> None:
    """A fence is the server's clock in µs, or one more than the name's last
    fence when that is higher: a master whose clock is behind the one before
    a failover still hands out rising fences.  Both grants are covered, the
    uncontended acquire's and a release's hand-over to a blocked waiter, and
    the fence key keeps its retention."""
    name = f"fence-ahead-{kind}"
    first = _primitive(kind, r, name)
    seconds, micros = r.time()
    ahead = (int(seconds) + 3600) * 1_000_000 + int(micros)  # an hour ahead
    r.set(first.keys.fence, ahead)
    assert first.acquire(blocking=False)
    assert first.fence == ahead + 1
    waiter = _primitive(kind, r, name)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=5)))
    thread.start()
    wait_until(lambda: blocked_clients(r) >= 1, 5, what="the waiter to block")
    first.release()
    thread.join(5)
    assert got == [True]
    assert waiter.fence == ahead + 2
    assert r.get(waiter.keys.fence) == str(ahead + 2).encode()
    assert 0 < r.pttl(waiter.keys.fence) <= waiter._keep_ms  # (the retention, in ms)
    waiter.release()


@pytest.mark.parametrize("kind", ["lock", "semaphore", "write side"])
def test_a_grant_whose_fence_cannot_be_written_takes_nothing(r: redis.Redis, kind: str) -> None:
    """The fence is written before the grant: a script that fails there
    (here a fence key of the wrong type; a server before Redis 6.2 fails the
    same call, SET ... GET) leaves no holder behind for its lease."""
    prim = _primitive(kind, r, f"fence-unwritable-{kind}")
    r.rpush(prim.keys.fence, "not a fence")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        prim.acquire(blocking=False)
    assert r.exists(prim.key) == 0
    r.delete(prim.keys.fence)
    assert prim.acquire(blocking=False)
    prim.release()


def test_fences_keep_rising_across_a_restart_without_persistence() -> None:
    server = RedisServer().start()
    try:
        client = redis.Redis(port=server.port)
        fences = []
        for _ in range(3):
            with Lock(client, "restarted", ttl=5.0) as lock:
                fences.append(lock.fence)
        server.restart()  # --save '' --appendonly no: the fence key is gone
        assert client.dbsize() == 0
        with Lock(client, "restarted", ttl=5.0) as lock:
            fences.append(lock.fence)
        # And after the fence key expires.
        short = Lock(client, "expiring-fence", ttl=0.2, fence_retention=0.3)
        with short:
            fences.append(short.fence)
        wait_until(lambda: client.exists(short.keys.fence) == 0, 3, what="the fence key to expire")
        with short:
            fences.append(short.fence)
        assert_rising(fences[:4])
        assert fences[5] > fences[4]
        client.close()
    finally:
        server.stop()


def _wait_then_report(url: str, name: str, conn: Any) -> None:
    lock = Lock(redis.Redis.from_url(url), name, ttl=0.5)
    ok = lock.acquire(timeout=10)
    conn.send((ok, time.monotonic(), lock.fence, lock.owned(), lock.lost))
    time.sleep(0.2)
    lock.release()


def test_a_hand_over_heard_too_late_is_not_taken_for_a_lease(
    r: redis.Redis, redis_url: str
) -> None:
    """The waiter is paused (SIGSTOP) while the release hands it the lock, past
    the lease: by the time it runs again, the server has expired that grant
    and granted the lock to someone else.  acquire() must not return True on
    the late wake-up; it queues again and is served after the new holder."""
    holder = Lock(r, "late-wake", ttl=5.0)
    assert holder.acquire()
    ctx = fork_context()
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=_wait_then_report, args=(redis_url, "late-wake", child_end))
    with running([proc]):
        wait_until(lambda: blocked_clients(r) == 1, 5, what="the waiter to block")
        os.kill(proc.pid, signal.SIGSTOP)
        holder.release()  # handed to the paused waiter, for 0.5 s
        handed = r.get(holder.key)
        wait_until(lambda: r.exists(holder.key) == 0, 2, what="the handed lease to run out")
        newcomer = Lock(r, "late-wake", ttl=5.0)
        assert newcomer.acquire(blocking=False)
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.3)  # the waiter hears its stale wake-up now
        early = parent_end.poll(0)
        released_at = time.monotonic()
        newcomer_fence = newcomer.fence
        newcomer.release()
        assert parent_end.poll(5)
        ok, returned_at, fence, owned, lost = parent_end.recv()
        proc.join(5)
    assert handed is not None  # the grant did happen
    assert early is False  # no acquire() returned while the newcomer held the lock
    assert ok is True and owned is True and lost is False
    assert returned_at >= released_at
    assert fence > newcomer_fence
