"""The asyncio primitives: exclusion among coroutines, a hand-over from a sync
holder, and a semaphore's limit.

    python examples/asyncio/run.py        # REDIS_URL, default redis://127.0.0.1:6379/0

Exits 0 once every part did what it says, 1 otherwise, 2 when Redis cannot be reached.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import redis
import redis.asyncio

from celery_redislock import BackendUnavailable
from celery_redislock import Lock as SyncLock
from celery_redislock.asyncio import Lock, Semaphore

COUNTER = "example:asyncio:counter"


async def exclusion(client: redis.asyncio.Redis) -> bool:
    """Ten coroutines, five read-modify-write increments each, under one Lock."""
    await client.delete(COUNTER)

    async def bump() -> None:
        for _ in range(5):
            async with Lock(client, "example:counter", ttl=5):
                value = int(await client.get(COUNTER) or 0)
                await asyncio.sleep(0.001)  # without the lock, another would read here
                await client.set(COUNTER, value + 1)

    await asyncio.gather(*(bump() for _ in range(10)))
    total = int(await client.get(COUNTER) or 0)
    await client.delete(COUNTER)
    print(f"exclusion: the counter reads {total} after 50 increments by 10 coroutines")
    return total == 50


async def hand_over(client: redis.asyncio.Redis, url: str) -> bool:
    """A sync holder (a thread here; any process) hands the lock to a waiting coroutine."""
    with redis.Redis.from_url(url) as sync_client:
        held = SyncLock(sync_client, "example:report", ttl=10)
        held.acquire()
        before = held.fence or 0
        threading.Timer(0.2, held.release).start()
        async with Lock(client, "example:report", ttl=10, timeout=5) as lock:
            after = lock.fence or 0
    print(
        "hand-over: a sync holder released, the coroutine woken holds it; "
        f"fence rose: {after > before}"
    )
    return after > before


async def semaphore(client: redis.asyncio.Redis) -> bool:
    """Six coroutines, a semaphore of two permits."""
    inside = peak = 0

    async def use() -> None:
        nonlocal inside, peak
        async with Semaphore(client, "example:api", limit=2, ttl=5):
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.02)
            inside -= 1

    await asyncio.gather(*(use() for _ in range(6)))
    print(f"semaphore: at most {peak} of 6 coroutines held a permit at once (limit 2)")
    return peak == 2


async def main(url: str) -> int:
    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.ping()
        results = [await exclusion(client), await hand_over(client, url), await semaphore(client)]
    except (BackendUnavailable, redis.ConnectionError) as exc:
        print(f"asyncio example: cannot reach Redis at {url}: {exc}", file=sys.stderr)
        return 2
    finally:
        closing = getattr(client, "aclose", None) or client.close  # (redis-py 5.0: close)
        await closing()
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))))
