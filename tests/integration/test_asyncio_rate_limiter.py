"""The asyncio RateLimiter against a real redis-server: spacing, bursts,
refusals, timeouts, round trips, sleeping on the loop, cancellation, and one
limit shared with the sync RateLimiter.

Each test drives its coroutine with ``asyncio.run``.  Round trips are counted
client-side (tests.asyncio_support.counting_client); timings use the loop's
clock (monotonic).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from celery_redislock import BackendUnavailable
from celery_redislock import RateLimiter as SyncRateLimiter
from celery_redislock.asyncio import RateLimiter
from tests.asyncio_support import close, counting_client
from tests.helpers import sha
from tests.integration.test_rate_limiter import EARLY, LATE, assert_on_slots, gaps
from tests.redis_server import free_port


async def timed_acquires(limiter: RateLimiter, n: int) -> list[float]:
    """Loop times at which ``n`` blocking acquires returned, from the first call."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    times = []
    for _ in range(n):
        assert await limiter.acquire() is True
        times.append(loop.time() - started)
    return times


def test_blocking_acquires_are_spaced_and_a_burst_comes_at_once(
    r: redis.Redis, redis_url: str
) -> None:
    async def body() -> tuple[list[float], list[float]]:
        client = aredis.Redis.from_url(redis_url)
        try:
            spaced = await timed_acquires(RateLimiter(client, "spaced", "20/s"), 5)
            bursty = await timed_acquires(RateLimiter(client, "bursty", "20/s", burst=3), 5)
            return spaced, bursty
        finally:
            await close(client)

    spaced, bursty = asyncio.run(body())
    assert_on_slots(spaced, 0.05)
    assert_on_slots(bursty, 0.05, burst=3)  # three at once, then one every 50 ms


def test_refusals_reservations_and_timeouts(r: redis.Redis, redis_url: str) -> None:
    async def body() -> dict[str, Any]:
        client = aredis.Redis.from_url(redis_url)
        loop = asyncio.get_running_loop()
        seen: dict[str, Any] = {}
        try:
            four = RateLimiter(client, "four", "1/s", burst=4)
            seen["non-blocking"] = [await four.acquire(blocking=False) for _ in range(8)]
            slots = RateLimiter(client, "slots", "10/s")
            seen["slots"] = [await slots.reserve() for _ in range(4)]

            limiter = RateLimiter(client, "timeout", "2/s")
            assert await limiter.acquire()
            state = await client.get(limiter.key)
            started = loop.time()
            seen["refused"] = await limiter.acquire(timeout=0.3)
            seen["refused in"] = loop.time() - started
            seen["state kept"] = await client.get(limiter.key) == state
            seen["waited"] = await limiter.acquire(timeout=0.6)
            seen["waited for"] = loop.time() - started
            async with limiter as entered:
                seen["entered"] = entered is limiter
            seen["entered after"] = loop.time() - started
            return seen
        finally:
            await close(client)

    seen = asyncio.run(body())
    assert seen["non-blocking"] == [True] * 4 + [False] * 4
    slots = seen["slots"]
    assert slots[0] == 0.0
    assert all(0.1 - LATE < gap <= 0.1 for gap in gaps(slots)), slots
    assert seen["refused"] is False and seen["refused in"] < 0.1
    assert seen["state kept"]  # the refused call took nothing: the next slot is still 0.5 s away
    assert seen["waited"] is True and 0.5 - EARLY <= seen["waited for"] <= 0.5 + LATE
    assert seen["entered"] and 1.0 - EARLY <= seen["entered after"] <= 1.0 + LATE


def test_every_acquire_and_reserve_is_one_round_trip(r: redis.Redis, redis_url: str) -> None:
    async def body() -> list[list[list[str]]]:
        async with counting_client(redis_url) as (client, trips):
            await RateLimiter(client, "warm-up", "10/s").acquire()
            limiter = RateLimiter(client, "trips", "20/s")
            seen = []
            for call in (
                lambda: limiter.acquire(),
                lambda: limiter.acquire(),  # waits 50 ms
                lambda: limiter.acquire(blocking=False),
                lambda: limiter.acquire(timeout=0.01),
                lambda: limiter.reserve(),
            ):
                trips.reset()
                await call()
                seen.append(trips.names())
                assert trips.sends[0][0][1] == sha("rate_acquire")
            return seen

    assert asyncio.run(body()) == [[["EVALSHA"]]] * 5


def test_a_sleeping_acquire_leaves_the_loop_free(r: redis.Redis, redis_url: str) -> None:
    """While one coroutine waits for its slot, others run; and many waiting at
    once wait together, each for its own slot, not one after another."""

    async def body() -> tuple[int, float, list[float]]:
        client = aredis.Redis.from_url(redis_url)
        loop = asyncio.get_running_loop()
        try:
            limiter = RateLimiter(client, "loop", "5/s")
            assert await limiter.acquire()
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.005)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            started = loop.time()
            assert await limiter.acquire()  # 200 ms away
            waited = loop.time() - started
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

            many = RateLimiter(client, "many", "50/s")
            started = loop.time()

            async def one() -> float:
                assert await many.acquire()
                return loop.time() - started

            return ticks, waited, sorted(await asyncio.gather(*(one() for _ in range(10))))
        finally:
            await close(client)

    ticks, waited, times = asyncio.run(body())
    assert 0.2 - EARLY <= waited <= 0.2 + LATE
    assert ticks >= 10, f"the loop ticked {ticks} times in {waited:.3f} s"
    # Ten slots 20 ms apart: 180 ms for all, not ten waits in a row.
    assert_on_slots(times, 0.02)


def test_a_cancelled_acquire_spends_its_slot(r: redis.Redis, redis_url: str) -> None:
    async def body() -> tuple[float, int]:
        client = aredis.Redis.from_url(redis_url)
        loop = asyncio.get_running_loop()
        try:
            limiter = RateLimiter(client, "cancelled", "10/s")
            started = loop.time()
            assert await limiter.acquire()
            waiting = asyncio.create_task(limiter.acquire())  # takes the slot at 100 ms
            await asyncio.sleep(0.03)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            ttl = await client.pttl(limiter.key)
            slot = await limiter.reserve()
            return slot + (loop.time() - started), ttl
        finally:
            await close(client)

    slot, ttl = asyncio.run(body())
    # The next free slot is the third (200 ms): the cancelled one's (100 ms) is gone.
    assert 0.2 - EARLY < slot <= 0.2 + LATE
    assert 100 < ttl <= 201


def test_sync_and_asyncio_clients_share_one_limit(r: redis.Redis, redis_url: str) -> None:
    sync = SyncRateLimiter(r, "shared", "10/s")

    async def body() -> list[Any]:
        client = aredis.Redis.from_url(redis_url)
        try:
            limiter = RateLimiter(client, "shared", "10/s")
            assert limiter.key == sync.key
            seen: list[Any] = [sync.acquire(blocking=False)]
            seen.append(await limiter.acquire(blocking=False))  # the sync start was the one
            seen.append(await limiter.reserve())  # the next, 100 ms on
            seen.append(sync.acquire(blocking=False))
            seen.append(sync.reserve())  # then 200 ms on
            seen.append(await limiter.reserve())
            return seen
        finally:
            await close(client)

    took, refused, first, sync_refused, second, third = asyncio.run(body())
    assert took is True and refused is False and sync_refused is False
    assert 0.1 - LATE < first <= 0.1 and 0.2 - LATE < second <= 0.2
    assert 0.3 - LATE < third <= 0.3


def test_an_unreachable_redis_raises_backend_unavailable_naming_the_key() -> None:
    async def body() -> list[BaseException]:
        client = aredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
        limiter = RateLimiter(client, "nowhere", "10/s")
        errors = []
        try:
            for attempt in (limiter.acquire, limiter.reserve):
                with pytest.raises(BackendUnavailable) as caught:
                    await attempt()
                assert limiter.key in str(caught.value)
                errors.append(caught.value)
        finally:
            await close(client)
        return errors

    for error in asyncio.run(body()):
        assert isinstance(error.__cause__, redis.ConnectionError)
