"""What every process of a fault campaign does: take locks, record sections.

Two mutexes and one semaphore (limit 2) with a short lease; each process
picks one at random, holds it a moment and releases it, recording the
critical section (tests/faults/history.py) as it ends, so that a process
SIGKILLed loses only the one in progress.  :func:`loop` does it with the sync
primitives, :func:`async_loop` with the asyncio ones, on the same names.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import celery_redislock.asyncio as aio
from celery_redislock import BackendUnavailable, Lock, LockLost, Semaphore
from tests.faults.history import Section, save

__all__ = ["LIMIT", "MUTEXES", "PROCESSES", "SEMAPHORE", "TTL", "async_loop", "loop"]

TTL = 0.5
PROCESSES = 4
MUTEXES = ("m0", "m1")
SEMAPHORE, LIMIT = "s", 2


def loop(
    client: Any,
    out: Path,
    seed: int,
    until: float,
    fresh: Optional[Callable[[], Any]] = None,
    **options: Any,
) -> None:
    """Take a random one of the names, hold it a moment, release; until ``until``.
    Each section is appended to ``out`` as it ends (a SIGKILL loses only the
    one in progress).  With ``fresh``, each section goes through a new client
    it makes (a process that keeps connecting anew, as new workers do)."""
    rng = random.Random(seed)
    while time.monotonic() < until:
        if fresh is not None:
            client.close()
            client = fresh()
        name = rng.choice((*MUTEXES, SEMAPHORE))
        limit = LIMIT if name == SEMAPHORE else 1
        prim: Any = (
            Semaphore(client, name, LIMIT, ttl=TTL, **options)
            if limit > 1
            else Lock(client, name, ttl=TTL, **options)
        )
        try:
            if not prim.acquire(timeout=1.0):
                continue
        except BackendUnavailable:
            time.sleep(0.05)
            continue
        # The section starts as acquire() returns; the grant was at
        # granted_at or later (the library's earliest local estimate),
        # which orders grants even when a pause came in between.
        start, granted, fence = time.monotonic(), prim.granted_at, prim.fence
        time.sleep(rng.uniform(0.005, 0.04))
        end = time.monotonic()
        outcome = "lost" if prim.lost else "released"
        try:
            prim.release()
        except LockLost:
            outcome = "lost"
        except BackendUnavailable:
            outcome = "lost"  # told: it could not confirm the release
        save(out, [Section(name, limit, fence, start, end, outcome, os.getpid(), granted)])


async def async_loop(client: Any, out: Path, seed: int, until: float) -> None:
    """:func:`loop` with the asyncio primitives on ``client`` (a ``redis.asyncio`` one)."""
    rng = random.Random(seed)
    while time.monotonic() < until:
        name = rng.choice((*MUTEXES, SEMAPHORE))
        limit = LIMIT if name == SEMAPHORE else 1
        prim: Any = (
            aio.Semaphore(client, name, LIMIT, ttl=TTL)
            if limit > 1
            else aio.Lock(client, name, ttl=TTL)
        )
        try:
            if not await prim.acquire(timeout=1.0):
                continue
        except BackendUnavailable:
            await asyncio.sleep(0.05)
            continue
        start, granted, fence = time.monotonic(), prim.granted_at, prim.fence
        await asyncio.sleep(rng.uniform(0.005, 0.04))
        end = time.monotonic()
        outcome = "lost" if prim.lost else "released"
        try:
            await prim.release()
        except (LockLost, BackendUnavailable):
            outcome = "lost"
        save(out, [Section(name, limit, fence, start, end, outcome, os.getpid(), granted)])
