"""A start under a rate limit carried by a lock's own acquire: one script
call takes both, or neither.

The task side uses this for runs whose acquire does not wait
(tests/integration/test_rate_tasks.py); here the primitives carry a
:class:`~celery_redislock.primitives.rates.Start` directly, on a real
redis-server, with round trips counted client-side.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_redislock import Lock, ReadWriteLock, Semaphore
from celery_redislock.primitives import keys
from celery_redislock.primitives.rates import Start, rate
from tests.helpers import counting_client, sha


def start(name: str, per_second: str) -> Start:
    return Start(keys.rate_key("redislock", name), rate(per_second, "test rate"))


@pytest.fixture
def counted(redis_url: str) -> Iterator[tuple[redis.Redis, Any]]:
    client, trips = counting_client(redis_url)
    yield client, trips
    client.close()


def test_a_grant_takes_the_start_in_the_same_call(
    r: redis.Redis, counted: tuple[redis.Redis, Any]
) -> None:
    client, trips = counted
    Lock(client, "warm", 5).acquire(blocking=False)  # connects, loads the script
    lock = Lock(client, "fold", 5)
    lock.start = start("fold", "1/s")
    trips.reset()
    assert lock.acquire(blocking=False) is True
    assert trips.names() == [["EVALSHA"]]
    assert trips.sends[0][0][1] == sha("lock_acquire")
    assert r.exists(lock.start.key) and 0 < r.pttl(lock.start.key) <= 1001
    lock.release()


def test_no_start_free_takes_nothing_and_says_when(r: redis.Redis) -> None:
    first = Lock(r, "busy-rate", 5)
    first.start = start("busy-rate", "1/s")
    assert first.acquire(blocking=False)
    first.release()
    second = Lock(r, "busy-rate", 5)
    second.start = first.start
    tat = r.get(first.start.key)
    assert second.acquire(blocking=False) is False
    assert second.over_rate_for is not None and 0.9 < second.over_rate_for <= 1.0
    # Neither the lock nor the start was taken, and nothing waits in line.
    assert not r.exists(second.keys.lock) and r.get(first.start.key) == tat
    assert r.zcard(second.keys.queue) == 0


def test_a_held_lock_spends_no_start(r: redis.Redis) -> None:
    holder = Lock(r, "held-rate", 5)
    assert holder.acquire(blocking=False)
    contender = Lock(r, "held-rate", 5)
    contender.start = start("held-rate", "1/s")
    assert contender.acquire(blocking=False) is False
    assert contender.over_rate_for is None  # contended, not over the rate
    assert not r.exists(contender.start.key)  # no start spent
    holder.release()
    assert contender.acquire(blocking=False) is True
    contender.release()


def test_a_parked_entry_spends_no_start_and_over_the_rate_parks_nothing(r: redis.Redis) -> None:
    holder = Lock(r, "park-rate", 5)
    assert holder.acquire(blocking=False)
    parker = Lock(r, "park-rate", 5)
    parker.start = start("park-rate", "1/s")
    assert parker.park("tok-1", b"payload") == "parked"
    assert not r.exists(parker.start.key)
    r.set(parker.start.key, str(10**18), px=5000)  # a start far off
    other = Lock(r, "park-rate", 5)
    other.start = parker.start
    assert other.park("tok-2", b"payload") == "over rate"
    assert r.hkeys(other.keys.pmsg) == [b"tok-1"]


def test_a_blocking_acquire_carries_no_start(r: redis.Redis) -> None:
    lock = Lock(r, "blocking-rate", 5)
    lock.start = start("blocking-rate", "1/s")
    assert lock.acquire(timeout=1.0) is True
    assert not r.exists(lock.start.key)
    lock.release()


@pytest.mark.parametrize("make", ["semaphore", "read", "write"])
def test_semaphores_and_read_write_locks_carry_a_start(r: redis.Redis, make: str) -> None:
    def build() -> Any:
        if make == "semaphore":
            return Semaphore(r, f"multi-rate-{make}", 3, 5)
        rw = ReadWriteLock(r, f"multi-rate-{make}", 5)
        return rw.read() if make == "read" else rw.write()

    limit = start(f"multi-rate-{make}", "2/s")
    first, second = build(), build()
    first.start = second.start = limit
    assert first.acquire(blocking=False) is True
    assert second.acquire(blocking=False) is False
    assert second.over_rate_for is not None and 0.4 < second.over_rate_for <= 0.5
    first.release()
