"""Semaphore against a real redis-server: limits, FIFO, fences, crashes, wakeups, limit changes.

Round trips are counted client-side (tests.helpers.counting_client); overlap is
measured from intervals that processes record with time.monotonic().
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from celery_redislock import ConfigurationError, ReadWriteLock, Semaphore
from celery_redislock.primitives import keys
from celery_redislock.tasks import parking
from tests.helpers import (
    Attempt,
    blocked_clients,
    counting_client,
    fork_context,
    keys_of,
    kill_now,
    outputs,
    peak_overlap,
    race,
    report,
    running,
    server_ms,
    sha,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("no_leaked_leases")


# -- round trips ---------------------------------------------------------------------


def test_acquire_and_release_are_one_round_trip_each(redis_url: str, r: redis.Redis) -> None:
    client, trips = counting_client(redis_url)
    warm = Semaphore(client, "warm-up", 3)
    warm.acquire()
    warm.release()  # scripts loaded, connection open and handshaken

    sem = Semaphore(client, "trips", 2)
    other = Semaphore(client, "trips", 2)
    for holder in (sem, other):
        trips.reset()
        assert holder.acquire()
        assert trips.names() == [["EVALSHA"]]
        assert trips.sends[0][0][1] == sha("multi_acquire")
    assert sem.holders() == 2

    third = Semaphore(client, "trips", 2)
    trips.reset()
    assert third.acquire(blocking=False) is False  # full: one ask, no queueing
    assert trips.names() == [["EVALSHA"]]

    for holder in (sem, other):
        trips.reset()
        holder.release()
        assert trips.names() == [["EVALSHA"]]
        assert trips.sends[0][0][1] == sha("multi_release")
    assert r.zcard(sem.keys.holders) == 0


def test_blocked_waiter_does_not_poll(redis_url: str, r: redis.Redis) -> None:
    """A waiter makes one ask and one BLPOP, however long the holder holds."""
    holder = Semaphore(r, "no-poll", 1, ttl=10.0)
    holder.acquire()
    client, trips = counting_client(redis_url)
    client.ping()
    waiter = Semaphore(client, "no-poll", 1, ttl=10.0)
    trips.reset()
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(waiter.acquire(timeout=10)))
    thread.start()
    wait_until(lambda: blocked_clients(r) == 1, 2, what="the waiter to block")
    time.sleep(1.0)
    holder.release()
    thread.join(5)
    assert result == [True]
    # (the wait's own connection opened: a handshake, then the BLPOP)
    assert trips.names(handshake=False) == [["EVALSHA"], ["BLPOP"]]
    waiter.release()


# -- at most `limit` holders -------------------------------------------------------

HAMMER_PROCESSES = 9
HAMMER_CYCLES = 6
HAMMER_LIMIT = 3


def _hammer(url: str, go: Any, out: str) -> None:
    client = redis.Redis.from_url(url)
    if not go.wait(30):
        raise RuntimeError("never told to go")
    records = []
    for _ in range(HAMMER_CYCLES):
        sem = Semaphore(client, "hammer", HAMMER_LIMIT, ttl=10.0)
        asked = time.monotonic()
        if not sem.acquire(timeout=30):
            raise RuntimeError("acquire timed out")
        start = time.monotonic()
        fence = sem.fence
        time.sleep(0.01)
        end = time.monotonic()
        sem.release()
        records.append((asked, start, end, fence))
    Path(out).write_text(json.dumps(records))
    client.close()


def test_at_most_limit_holders_across_processes_and_fences_increase(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    exitcodes = race(_hammer, [(redis_url,)] * HAMMER_PROCESSES, tmp_path)
    assert exitcodes == [0] * HAMMER_PROCESSES
    per_process = outputs(tmp_path, HAMMER_PROCESSES)
    records = [rec for recs in per_process for rec in recs]
    assert len(records) == HAMMER_PROCESSES * HAMMER_CYCLES

    assert peak_overlap((rec[1], rec[2]) for rec in records) == HAMMER_LIMIT
    # Really contended: most sections waited for a permit.
    assert sum(1 for rec in records if rec[1] - rec[0] > 0.005) >= len(records) // 2
    # One fence per grant, all distinct; each process saw its own fences go up;
    # and a caller that asked after another's section ended was granted after it.
    fences = [rec[3] for rec in records]
    assert len(set(fences)) == len(records)
    for recs in per_process:
        assert [rec[3] for rec in recs] == sorted(rec[3] for rec in recs)
    later = [(a[3], b[3]) for a in records for b in records if a[2] < b[0]]
    assert later and all(fa < fb for fa, fb in later)

    k = keys.multi_keys("redislock", "hammer", "sem")
    assert r.zcard(k.holders) == 0
    assert r.exists(k.queue, k.meta, k.info) == 0  # the last release left nothing
    assert r.get(k.fence) == str(max(fences)).encode()


def test_waiters_are_served_in_arrival_order(r: redis.Redis) -> None:
    holders = [Semaphore(r, "fifo", 2, ttl=10.0) for _ in range(2)]
    for h in holders:
        assert h.acquire(blocking=False)
    last_fence = max(h.fence for h in holders)  # type: ignore[type-var]
    queue = holders[0].keys.queue
    grants: list[tuple[int, int]] = []
    lock = threading.Lock()

    def waiter(i: int) -> None:
        sem = Semaphore(r, "fifo", 2, ttl=10.0, owner=f"w{i}-")
        if sem.acquire(timeout=10):
            with lock:
                grants.append((i, sem.fence))  # type: ignore[arg-type]
            time.sleep(0.02)
            sem.release()

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(1, 7)]
    for i, thread in enumerate(threads, 1):
        thread.start()
        wait_until(lambda i=i: r.zcard(queue) == i, 2, what=f"waiter {i} to queue")
        time.sleep(0.01)  # arrival scores are in ms: keep arrivals apart
    assert [m.decode().split("-")[0] for m in r.zrange(queue, 0, -1)] == [
        f"w{i}" for i in range(1, 7)
    ]
    for h in holders:
        h.release()
    for thread in threads:
        thread.join(10)
    # Each grant took a higher fence, in arrival order.
    ordered = sorted(grants, key=lambda g: g[1])
    assert [i for i, _ in ordered] == [1, 2, 3, 4, 5, 6]
    assert ordered[0][1] > last_fence


# -- crashes -------------------------------------------------------------------------


def _hold_until_killed(url: str, name: str, ttl: float, conn: Any) -> None:
    sem = Semaphore(redis.Redis.from_url(url), name, 2, ttl=ttl)
    sem.acquire()
    conn.send((sem.token, sem.fence))
    time.sleep(60)


@pytest.mark.fault
def test_killed_holders_permit_returns_when_its_lease_ends_not_before(
    redis_url: str, r: redis.Redis
) -> None:
    ttl = 1.0
    other = Semaphore(r, "crash", 2, ttl=10.0)  # the other permit stays held throughout
    assert other.acquire(blocking=False)
    ctx = fork_context()
    parent_end, child_end = ctx.Pipe()
    holder = ctx.Process(target=_hold_until_killed, args=(redis_url, "crash", ttl, child_end))
    waiter = Semaphore(r, "crash", 2, ttl=10.0)
    granted = Attempt(waiter, timeout=5)
    with running([holder]):
        assert parent_end.poll(10)
        token, holder_fence = parent_end.recv()
        granted.start()
        wait_until(lambda: blocked_clients(r) == 1, 2, what="the waiter to block")
        time.sleep(ttl)  # the child's keeper renews it past its first lease
        killed_at = kill_now(holder)
        left_ms = int(float(r.zscore(waiter.keys.holders, token))) - server_ms(r)  # type: ignore[arg-type]
        granted.join(5)
    expires_at = killed_at + left_ms / 1000
    assert left_ms > 300  # the dead holder's lease was still running when it died
    assert granted.ok is True
    assert granted.at >= expires_at - 0.02
    assert granted.at - killed_at <= ttl + 0.3
    assert waiter.fence > holder_fence  # type: ignore[operator]
    assert other.owned()
    assert r.zcard(waiter.keys.holders) == 2
    report(
        "semaphore crashed holder", lease_left_s=left_ms / 1000, regrant_s=granted.at - killed_at
    )
    waiter.release()
    other.release()


# -- wakeups -------------------------------------------------------------------------

WAKE_ROUNDS = 5


def _wait_rounds(url: str, conn: Any) -> None:
    client = redis.Redis.from_url(url)
    for _ in range(WAKE_ROUNDS):
        conn.recv()  # the parent holds the permit now
        sem = Semaphore(client, "wakeup", 1, ttl=10.0, owner="proc-waiter-")
        ok = sem.acquire(timeout=10)
        conn.send((ok, time.monotonic(), sem.fence))
        sem.release()


def test_waiter_in_another_process_is_woken_within_50ms_of_a_release(
    redis_url: str, r: redis.Redis
) -> None:
    ctx = fork_context()
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=_wait_rounds, args=(redis_url, child_end))
    latencies = []
    with running([proc]):
        for _ in range(WAKE_ROUNDS):
            holder = Semaphore(r, "wakeup", 1, ttl=10.0)
            assert holder.acquire(timeout=5)
            parent_end.send("go")
            wait_until(lambda: blocked_clients(r) == 1, 5, what="the waiter to block")
            held_fence = holder.fence
            released_at = time.monotonic()
            holder.release()
            assert parent_end.poll(5)
            ok, granted_at, fence = parent_end.recv()
            assert ok is True
            assert fence > held_fence  # type: ignore[operator]
            latencies.append(granted_at - released_at)
        proc.join(5)
    assert proc.exitcode == 0
    # Woken by the release itself: a poll would show its interval here.  The
    # median, since one round may lose the CPU on a loaded machine.
    assert all(x >= 0 for x in latencies)
    assert statistics.median(latencies) < 0.05, latencies
    assert max(latencies) < 0.25, latencies
    report(
        "semaphore hand-over latency",
        median_ms=statistics.median(latencies) * 1000,
        max_ms=max(latencies) * 1000,
    )


# -- changing the limit ---------------------------------------------------------------


def test_lowering_the_limit_revokes_nobody_and_later_grants_respect_it(r: redis.Redis) -> None:
    old = [Semaphore(r, "resize", 3, ttl=10.0) for _ in range(3)]
    for s in old:
        assert s.acquire(blocking=False)
    result: list[tuple[bool, float]] = []
    low = Semaphore(r, "resize", 1, ttl=10.0)

    def wait() -> None:
        result.append((low.acquire(timeout=10), time.monotonic()))

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: r.zcard(low.keys.queue) == 1, 2, what="the waiter to queue")
    # Nobody lost a permit, and none of the old holders' releases lets it in
    # while another old holder remains.
    assert [s.owned() for s in old] == [True, True, True]
    assert low.holders() == 3
    old[0].release()
    old[1].release()
    time.sleep(0.1)
    assert result == []
    assert low.holders() == 1
    released_at = time.monotonic()
    old[2].release()
    thread.join(5)
    assert result and result[0][0] is True
    assert result[0][1] - released_at < 0.05
    # New grants respect the new limit.
    newcomer = Semaphore(r, "resize", 1, ttl=10.0)
    assert newcomer.acquire(blocking=False) is False
    low.release()
    assert newcomer.acquire(blocking=False) is True
    newcomer.release()


def test_raising_the_limit_lets_waiters_in(r: redis.Redis) -> None:
    holders = [Semaphore(r, "grow", 2, ttl=10.0) for _ in range(2)]
    for s in holders:
        assert s.acquire(blocking=False)
    granted: dict[int, float] = {}

    def wait(i: int) -> None:
        sem = Semaphore(r, "grow", 2, ttl=10.0)
        if sem.acquire(timeout=10):
            granted[i] = time.monotonic()
            time.sleep(0.3)
            sem.release()

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(2)]
    for i, thread in enumerate(threads, 1):
        thread.start()
        wait_until(lambda i=i: r.zcard(holders[0].keys.queue) == i, 2, what="waiters")
    time.sleep(0.05)
    assert granted == {}
    raised_at = time.monotonic()
    bigger = Semaphore(r, "grow", 5, ttl=10.0)
    assert bigger.acquire(timeout=1)  # the queued waiters first, then this one
    took = time.monotonic() - raised_at
    wait_until(lambda: len(granted) == 2, 1, what="both waiters to be let in")
    assert all(at - raised_at < 0.05 for at in granted.values())
    assert took < 0.05
    assert bigger.holders() == 5
    assert bigger.fence > max(s.fence for s in holders)  # type: ignore[operator]
    for thread in threads:
        thread.join(5)
    for s in (*holders, bigger):
        s.release()


def test_bad_limit_raises_configuration_error_naming_it(r: redis.Redis) -> None:
    for limit in (0, -1, 1.5, True, "3", None):
        with pytest.raises(ConfigurationError, match="limit of semaphore 'bad'") as exc_info:
            Semaphore(r, "bad", limit)  # type: ignore[arg-type]
        assert repr(limit) in str(exc_info.value)


# -- Redis Cluster --------------------------------------------------------------------

NAMES = ["plain", "with {braces}", "x" * 300, "#not-a-digest", "ünï:cødé"]


@pytest.mark.parametrize("name", NAMES)
def test_every_key_a_semaphore_or_rw_lock_touches_is_in_one_slot(
    redis_url: str, r: redis.Redis, name: str
) -> None:
    """Every key the scripts were given, and every key that exists in Redis, shares a slot."""
    client, trips = counting_client(redis_url)
    sem = Semaphore(client, name, 1, ttl=10.0)
    rw = ReadWriteLock(client, name, ttl=10.0)
    assert sem.acquire()
    reader = rw.read()
    assert reader.acquire()
    writer = rw.write()
    results: list[bool] = []
    waiters = [
        threading.Thread(
            target=lambda: results.append(Semaphore(client, name, 1).acquire(timeout=0.3))
        ),
        threading.Thread(target=lambda: results.append(writer.acquire(timeout=0.3))),
    ]
    for t in waiters:
        t.start()
    wait_until(lambda: blocked_clients(r) == 2, 2, what="both waiters to block")
    parked = Semaphore(client, name, 1, ttl=10.0)
    parking.configure(parked, 10.0, lambda _: None)
    assert parked.park("parked-token", b"payload") == "parked"
    existing = list(r.keys("*"))  # holders, info, fences, queues, metas, the parked payload
    for t in waiters:
        t.join(5)
    sem.release()
    reader.release()

    assert results == [False, False]
    script_keys = keys_of(c for send in trips.sends for c in send if c[0] == b"EVALSHA")
    blpop_keys = [c[1] for send in trips.sends for c in send if c[0] == b"BLPOP"]
    assert len(blpop_keys) == 2
    every = {*script_keys, *blpop_keys, *existing}
    assert len(existing) >= 8
    assert {key_slot(k) for k in every} == {key_slot(sem.key.encode("utf-8", "surrogatepass"))}
    # The semaphore and the read-write lock of one name share the tag, not keys.
    assert not set(sem.keys.script_keys) & set(rw.keys.script_keys)
