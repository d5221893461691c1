"""Helpers of the asyncio primitives' tests: counting clients, closing them, no leftovers.

The tests drive their coroutines with ``asyncio.run`` inside plain test
functions (no pytest plugin needed).  ``counting_client`` gives a
``redis.asyncio.Redis`` whose every round trip (one ``send_packed_command``:
a command, or a whole pipeline) is recorded in a tests.helpers.RoundTrips,
including those of the connections the library makes from the pool's
connection class and settings for its waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aredis

from celery_redislock.asyncio import renewal
from tests.helpers import RoundTrips, parse_commands

__all__ = ["CountingConnection", "close", "counting_client", "no_renewals", "wait_for"]


class CountingConnection(aredis.Connection):
    """A ``redis.asyncio.Connection`` that records each round trip it sends."""

    def __init__(self, *args: Any, round_trips: RoundTrips, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_trips = round_trips

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        chunks = [command] if isinstance(command, (bytes, str)) else command
        packed = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        await super().send_packed_command(command, check_health)
        self.round_trips.record(parse_commands(packed))


async def close(client: Any) -> None:
    """Close ``client`` and its pool (redis-py 5.0 has ``close``, later ones ``aclose``)."""
    closing = getattr(client, "aclose", None) or client.close
    await closing()
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        await pool.disconnect()


@contextlib.asynccontextmanager
async def counting_client(
    url: str, **kwargs: Any
) -> AsyncIterator[tuple[aredis.Redis, RoundTrips]]:
    trips = RoundTrips()
    pool = aredis.ConnectionPool.from_url(
        url, connection_class=CountingConnection, round_trips=trips, **kwargs
    )
    client = aredis.Redis(connection_pool=pool)
    try:
        yield client, trips
    finally:
        await close(client)


async def wait_for(predicate: Any, timeout: float = 5.0, what: str = "") -> Any:
    """Await ``predicate()`` (a coroutine function or plain one) until truthy."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > ends:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.005)


async def no_renewals() -> None:
    """Every lease released: no renewer of this loop has a lease left to renew."""
    await wait_for(lambda: not renewal.renewers(), 2.0, "the renewers to be left with no lease")
