"""ReadWriteLock against a real redis-server: sharing, exclusion, writer preference, crashes.

Sections record (asked, start, end, mode, fence) with time.monotonic(); the
assertions are about those measured intervals.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_redislock import ReadWriteLock
from tests.helpers import (
    Attempt,
    blocked_clients,
    counting_client,
    fork_context,
    kill_now,
    outputs,
    overlapping,
    peak_overlap,
    race,
    report,
    running,
    server_ms,
    sha,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("no_leaked_leases")


# -- round trips -----------------------------------------------------------------------


def test_read_and_write_acquire_and_release_are_one_round_trip_each(redis_url: str) -> None:
    client, trips = counting_client(redis_url)
    warm = ReadWriteLock(client, "warm-up").write()
    warm.acquire()
    warm.release()

    rw = ReadWriteLock(client, "trips", ttl=10.0)
    readers = [rw.read(), rw.read()]
    for reader in readers:
        trips.reset()
        assert reader.acquire()
        assert trips.names() == [["EVALSHA"]]
        assert trips.sends[0][0][1] == sha("multi_acquire")
    for reader in readers:
        trips.reset()
        reader.release()
        assert trips.names() == [["EVALSHA"]]
        assert trips.sends[0][0][1] == sha("multi_release")

    writer = rw.write()
    trips.reset()
    assert writer.acquire()
    assert trips.names() == [["EVALSHA"]]
    trips.reset()
    writer.release()
    assert trips.names() == [["EVALSHA"]]
    assert trips.sends[0][0][1] == sha("multi_release")


# -- the regression of the issue: a write side that never succeeds ---------------------


def test_write_on_a_free_lock_and_after_readers_leave_succeeds_at_once(r: redis.Redis) -> None:
    """Guards against a write side that tests a count with Lua truthiness (0 is true)."""
    rw = ReadWriteLock(r, "regress", ttl=10.0)
    writer = rw.write()
    assert writer.acquire(blocking=False) is True  # a lock nobody ever used
    assert rw.write_locked() and rw.holders() == 1
    assert rw.read().acquire(blocking=False) is False
    writer.release()
    assert not rw.write_locked() and rw.holders() == 0

    readers = [rw.read() for _ in range(3)]
    for reader in readers:
        assert reader.acquire(blocking=False)
    assert rw.write().acquire(blocking=False) is False  # the test can fail
    for reader in readers:
        reader.release()
    assert rw.holders() == 0
    writer = rw.write()
    asked = time.monotonic()
    assert writer.acquire(timeout=5) is True
    assert time.monotonic() - asked < 0.05
    writer.release()

    # And after a reader whose lease ran out without a release.
    lapsed = ReadWriteLock(r, "regress", ttl=0.2).read(renew=False)
    assert lapsed.acquire(blocking=False)
    time.sleep(0.25)
    writer = rw.write()
    assert writer.acquire(blocking=False) is True
    writer.release()


# -- sharing and exclusion --------------------------------------------------------------


def _reader(url: str, go: Any, conn: Any) -> None:
    rw = ReadWriteLock(redis.Redis.from_url(url), "shared", ttl=10.0)
    go.wait(10)
    with rw.read(timeout=5) as hold:
        start = time.monotonic()
        fence = hold.fence
        time.sleep(0.3)
        end = time.monotonic()
    conn.send((start, end, fence))


def test_readers_in_several_processes_hold_together(redis_url: str, r: redis.Redis) -> None:
    ctx = fork_context()
    go = ctx.Event()
    pipes = [ctx.Pipe() for _ in range(4)]
    procs = [ctx.Process(target=_reader, args=(redis_url, go, child)) for _, child in pipes]
    with running(procs):
        go.set()
        got = [parent.recv() for parent, _ in pipes if parent.poll(10)]
        for p in procs:
            p.join(5)
    assert len(got) == 4
    assert peak_overlap((s, e) for s, e, _ in got) == 4
    assert len({f for _, _, f in got}) == 4


MIXED_PROCESSES = 6
MIXED_CYCLES = 8


def _mixed(url: str, seed: int, go: Any, out: str) -> None:
    rnd = random.Random(seed)
    rw = ReadWriteLock(redis.Redis.from_url(url), "mixed", ttl=10.0)
    go.wait(10)
    records = []
    for _ in range(MIXED_CYCLES):
        mode = "w" if rnd.random() < 0.3 else "r"
        hold = rw.write() if mode == "w" else rw.read()
        asked = time.monotonic()
        if not hold.acquire(timeout=30):
            raise RuntimeError("acquire timed out")
        start = time.monotonic()
        time.sleep(0.01 if mode == "w" else 0.03)
        end = time.monotonic()
        fence = hold.fence
        hold.release()
        records.append((asked, start, end, mode, fence))
    Path(out).write_text(json.dumps(records))


def test_a_writer_excludes_readers_and_writers_across_processes(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    exitcodes = race(_mixed, [(redis_url, i) for i in range(MIXED_PROCESSES)], tmp_path)
    assert exitcodes == [0] * MIXED_PROCESSES
    records = [rec for recs in outputs(tmp_path, MIXED_PROCESSES) for rec in recs]
    writes = [(s, e) for _, s, e, mode, _ in records if mode == "w"]
    reads = [(s, e) for _, s, e, mode, _ in records if mode == "r"]
    assert len(writes) >= 5 and len(reads) >= 20
    clashes = [
        (w, other)
        for w in writes
        for other in writes + reads
        if other is not w and overlapping(w, other)
    ]
    assert clashes == []
    assert peak_overlap(reads) >= 3  # readers did share
    assert len({rec[4] for rec in records}) == len(records)
    rw = ReadWriteLock(r, "mixed")
    assert rw.holders() == 0 and not rw.write_locked()
    assert r.exists(rw.keys.queue, rw.keys.meta) == 0


# -- writer preference ------------------------------------------------------------------

READ_HOLD = 0.3


def test_a_writer_gets_in_despite_a_continuous_stream_of_readers(r: redis.Redis) -> None:
    """Readers overlap without a gap; a writer still gets in within one reader's hold."""
    rw = ReadWriteLock(r, "stream", ttl=10.0)
    stop = threading.Event()
    sections: list[tuple[float, float, float]] = []  # (asked, start, end) of readers
    lock = threading.Lock()

    def reader(delay: float) -> None:
        time.sleep(delay)
        while not stop.is_set():
            hold = rw.read()
            asked = time.monotonic()
            assert hold.acquire(timeout=10)
            start = time.monotonic()
            time.sleep(READ_HOLD)
            end = time.monotonic()
            hold.release()
            with lock:
                sections.append((asked, start, end))

    threads = [threading.Thread(target=reader, args=(i * READ_HOLD / 4,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # a steady stream: a new reader every READ_HOLD / 4 s

    writer = rw.write(owner="writer-")
    queued: list[float] = []

    def watch() -> None:
        wait_until(
            lambda: any(m.startswith(b"writer-") for m in r.zrange(rw.keys.queue, 0, -1)),
            5,
            0.001,
        )
        queued.append(time.monotonic())

    watcher = threading.Thread(target=watch)
    watcher.start()
    w_asked = time.monotonic()
    assert writer.acquire(timeout=5)
    w_start = time.monotonic()
    time.sleep(0.1)
    w_end = time.monotonic()
    writer.release()
    watcher.join(5)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(5)

    before = sorted((s, e) for _, s, e in sections if s < w_asked)
    # The stream was continuous: readers held without a gap up to the writer's ask.
    assert before[0][0] < w_asked - 0.9
    covered_until = before[0][1]
    for s, e in before[1:]:
        assert s < covered_until, "the readers left a gap: not a continuous stream"
        covered_until = max(covered_until, e)
    assert covered_until > w_asked
    # The writer waited at most the longest reader hold (plus the hand-over).
    assert w_start - w_asked <= READ_HOLD + 0.1
    assert w_start - w_asked > 0.01  # it did wait for readers
    # Exclusive, and readers that arrived after it queued behind it...
    assert [x for x in sections if overlapping((x[1], x[2]), (w_start, w_end))] == []
    assert queued
    behind = [x for x in sections if x[0] > queued[0]]
    assert len(behind) >= 2
    assert all(start >= w_end for _, start, _ in behind)
    # ...and all got in together when it left.
    first_after = sorted(start for _, start, _ in behind)[:4]
    assert first_after[-1] - w_end < 0.05
    report(
        "rw writer behind a reader stream",
        writer_wait_s=w_start - w_asked,
        readers_released_together_ms=(first_after[-1] - w_end) * 1000,
    )


# -- crashes ----------------------------------------------------------------------------


def _read_until_killed(url: str, ttl: float, conn: Any) -> None:
    hold = ReadWriteLock(redis.Redis.from_url(url), "crash", ttl=ttl).read()
    hold.acquire()
    conn.send((hold.token, hold.fence))
    time.sleep(60)


@pytest.mark.fault
def test_a_killed_reader_blocks_writers_for_at_most_its_lease(
    redis_url: str, r: redis.Redis
) -> None:
    ttl = 1.0
    ctx = fork_context()
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=_read_until_killed, args=(redis_url, ttl, child_end))
    rw = ReadWriteLock(r, "crash", ttl=10.0)
    writer = rw.write()
    granted = Attempt(writer, timeout=5)
    with running([proc]):
        assert parent_end.poll(10)
        token, reader_fence = parent_end.recv()
        granted.start()
        wait_until(lambda: blocked_clients(r) == 1, 2, what="the writer to block")
        time.sleep(ttl)  # the reader's keeper renews it past its first lease
        killed_at = kill_now(proc)
        left_ms = int(float(r.zscore(rw.keys.holders, token))) - server_ms(r)  # type: ignore[arg-type]
        granted.join(5)
    assert left_ms > 300
    assert granted.ok is True
    assert granted.at >= killed_at + left_ms / 1000 - 0.02
    assert granted.at - killed_at <= ttl + 0.3
    assert writer.fence > reader_fence  # type: ignore[operator]
    assert rw.write_locked() and rw.holders() == 1
    writer.release()
