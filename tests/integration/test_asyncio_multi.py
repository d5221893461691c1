"""The asyncio Semaphore and ReadWriteLock against a real redis-server, and
with the sync ones on the same names."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis

from celery_redislock import ConfigurationError
from celery_redislock import ReadWriteLock as SyncReadWriteLock
from celery_redislock import Semaphore as SyncSemaphore
from celery_redislock.asyncio import ReadWriteLock, Semaphore
from tests.asyncio_support import counting_client, no_renewals, wait_for

pytestmark = pytest.mark.usefixtures("no_leaked_leases")


def test_a_semaphore_admits_its_limit_shared_with_sync_holders(
    r: redis.Redis, redis_url: str
) -> None:
    sync_client = redis.Redis.from_url(redis_url)
    sync_holder = SyncSemaphore(sync_client, "pool", 3, ttl=10)
    assert sync_holder.acquire()  # one of the three permits, held by a sync holder

    async def body() -> tuple[int, list[int], int, bool]:
        async with counting_client(redis_url) as (client, _):
            inside, peak, fences = 0, 0, []

            async def worker() -> None:
                nonlocal inside, peak
                for _ in range(3):
                    async with Semaphore(client, "pool", 3, ttl=10) as permit:
                        inside += 1
                        peak = max(peak, inside)
                        fences.append(permit.fence)
                        assert await permit.owned()
                        await asyncio.sleep(0.002)
                        inside -= 1

            await asyncio.gather(*(worker() for _ in range(8)))
            probe = Semaphore(client, "pool", 3, ttl=10)
            holders = await probe.holders()
            owned = await probe.owned()
            await no_renewals()
            return peak, fences, holders, owned

    try:
        peak, fences, holders, owned = asyncio.run(body())
    finally:
        sync_holder.release()
        sync_client.close()
    assert peak == 2  # three permits, one of them the sync holder's
    assert len(set(fences)) == 24  # a fence per grant (granted side by side: in any order)
    assert (holders, owned) == (1, False)
    with pytest.raises(ConfigurationError, match="limit of semaphore 'x'"):
        Semaphore(None, "x", 0)


def test_readers_share_and_a_writer_excludes_them(r: redis.Redis, redis_url: str) -> None:
    async def body() -> dict[str, Any]:
        async with counting_client(redis_url) as (client, _):
            rw = ReadWriteLock(client, "doc", ttl=10)
            readers = [rw.read() for _ in range(3)]
            for reader in readers:
                assert await reader.acquire(blocking=False)
            seen: dict[str, Any] = {"readers": await rw.holders()}
            writer = rw.write()
            writing = asyncio.create_task(writer.acquire(timeout=5))
            await wait_for(lambda: client.zcard(rw.keys.queue), what="the writer to queue")
            # Writers are preferred: a reader arriving after it waits too.
            seen["late reader"] = await rw.read().acquire(blocking=False)
            for reader in readers:
                await reader.release()
            seen["writer"] = await writing
            seen["write locked"] = await rw.write_locked()
            seen["holders"] = await rw.holders()
            await writer.release()
            seen["after"] = await rw.write_locked()
            await no_renewals()
            return seen

    seen = asyncio.run(body())
    assert seen == {
        "readers": 3,
        "late reader": False,
        "writer": True,
        "write locked": True,
        "holders": 1,
        "after": False,
    }


def test_a_sync_writer_hands_over_to_asyncio_readers(r: redis.Redis, redis_url: str) -> None:
    sync_client = redis.Redis.from_url(redis_url)
    writer = SyncReadWriteLock(sync_client, "shared doc", ttl=10).write()
    assert writer.acquire()

    async def body() -> tuple[list[bool], list[int]]:
        async with counting_client(redis_url) as (client, _):
            rw = ReadWriteLock(client, "shared doc", ttl=10)
            readers = [rw.read() for _ in range(2)]
            tasks = [asyncio.create_task(reader.acquire(timeout=5)) for reader in readers]
            await wait_for(
                lambda: _at_least(client.zcard(rw.keys.queue), 2), what="the readers to queue"
            )
            released = threading.Thread(target=writer.release)
            released.start()
            got = list(await asyncio.gather(*tasks))
            released.join()
            fences = [reader.fence for reader in readers]
            for reader in readers:
                await reader.release()
            await no_renewals()
            return got, fences  # type: ignore[return-value]

    try:
        got, fences = asyncio.run(body())
    finally:
        sync_client.close()
    assert got == [True, True]
    assert all(fence is not None and fence > 0 for fence in fences)


async def _at_least(count: Any, n: int) -> bool:
    return int(await count) >= n
