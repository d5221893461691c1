"""The asyncio rows of bench/locks.py, and the hand-over rounds every row plays.

An asyncio lock is driven in its own event loop with a ``redis.asyncio``
client: its uncontended cycles are timed inside the loop (:class:`Driven`),
and its hand-overs are awaited there (:func:`play`), so neither pays for
entering the loop per call.  A sync lock plays the same rounds
(:func:`rounds`) with its calls made directly from the coroutine.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable
from typing import Any, Callable, Optional

import redis.asyncio
from common import command_name
from redis.asyncio.connection import Connection

#: The lease of every lock, in seconds (as bench/locks.py's TTL).
TTL = 10

now = time.monotonic

#: (round, latency, time blocked, segments or None) of each hand-over.
Sample = tuple[int, float, float, Optional[tuple[float, float, float]]]


class AsyncCountingConnection(Connection):
    """A ``redis.asyncio`` connection that logs the command name of every write,
    when asked: one write of a command or a pipeline is one round trip."""

    #: Names of the commands written since recording started; None: not recording.
    sent: Optional[list[str]] = None

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        sent = AsyncCountingConnection.sent
        if sent is not None:
            sent.append(command_name(command))
        await super().send_packed_command(command, check_health)


def make_client(port: int) -> redis.asyncio.Redis:
    pool = redis.asyncio.ConnectionPool(
        host="127.0.0.1", port=port, connection_class=AsyncCountingConnection
    )
    return redis.asyncio.Redis(connection_pool=pool)


def ours(client: Any, name: str) -> Any:
    from celery_redislock.asyncio import Lock

    # Defaults: renewal on (one task per event loop and client), wait forever.
    return Lock(client, name, ttl=TTL)


def redis_py(client: Any, name: str) -> Any:
    # Defaults: blocking=True, sleep=0.1 s between polls.
    return client.lock(name, timeout=TTL)


class Driven:
    """An asyncio lock in an event loop of its own, for the uncontended rows:
    ``acquire()`` and ``release()`` run one call each in the loop (warm-up and
    counting); :meth:`time_cycles` times cycles inside the loop."""

    def __init__(self, make: Callable[[Any, str], Any], port: int, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = self.loop.run_until_complete(_in_loop(make_client, port))
        self.lock = make(self.client, name)

    def acquire(self) -> bool:
        return bool(self.loop.run_until_complete(self.lock.acquire()))

    def release(self) -> None:
        self.loop.run_until_complete(self.lock.release())

    def time_cycles(self, cycles: int) -> list[float]:
        return self.loop.run_until_complete(self._cycles(cycles))

    async def _cycles(self, cycles: int) -> list[float]:
        lock, times = self.lock, []
        for _ in range(cycles):
            t0 = now()
            await lock.acquire()
            await lock.release()
            times.append(now() - t0)
        return times


async def _in_loop(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def awaiting(fn: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    """A sync call as a coroutine function (it blocks the loop, which runs nothing else)."""

    async def call() -> Any:
        return fn()

    return call


async def play(
    c: Any,
    port: int,
    name: str,
    peer: Any,
    holds_first: bool,
    count: int,
    hold: tuple[float, float],
) -> list[Sample]:
    """:func:`rounds` with an asyncio lock of contender ``c``, in this loop."""
    client = make_client(port)
    warm = c.make(client, name + ":warm")  # connect, load scripts, start the renewal task
    await warm.acquire()
    await warm.release()
    lock = c.make(client, name)
    try:
        return await rounds(lock.acquire, lock.release, peer, holds_first, count, hold)
    finally:
        await client.aclose() if hasattr(client, "aclose") else await client.close()


async def rounds(
    acquire: Callable[[], Awaitable[Any]],
    release: Callable[[], Awaitable[Any]],
    peer: Any,
    holds_first: bool,
    count: int,
    hold: tuple[float, float],
    timing: Any = None,
) -> list[Sample]:
    """The hand-over rounds of one player (see bench/locks.py's handoff_player);
    ``timing``: the connection class that notes its first send and last read."""
    rng = random.Random(os.getpid())
    samples: list[Sample] = []
    holding = holds_first
    if holding:
        await acquire()
    for i in range(count):
        if holding:
            peer.send("held")
            peer.recv()  # "waiting": the peer is about to call acquire()
            time.sleep(rng.uniform(*hold))
            if timing is not None:
                timing.first_send = None
            released_at = now()
            await release()
            peer.send((released_at, timing.first_send if timing is not None else None))
            holding = False
        else:
            peer.recv()  # "held"
            peer.send("waiting")
            called_at = now()
            await acquire()
            got_at = now()
            released_at, sent_at = peer.recv()
            parts = None
            if timing is not None and sent_at is not None:
                read_at = timing.last_read
                parts = (sent_at - released_at, read_at - sent_at, got_at - read_at)
            samples.append((i, got_at - released_at, released_at - called_at, parts))
            holding = True
    if holding:
        await release()
    return samples
