"""RateLimiter for asyncio: the same rate keys and script as the sync
:class:`celery_redislock.RateLimiter`, so sync and asyncio clients share one limit."""

from __future__ import annotations

import asyncio
from typing import Optional

from ..primitives.failures import unreachable
from ..primitives.rates import LimitState, Slot, parse_slot, slot_call
from ..transport import UNREACHABLE
from . import calls

__all__ = ["RateLimiter"]


class RateLimiter(LimitState):
    """At most ``rate`` starts across every client of the same Redis, ``burst``
    at once; ``await acquire()`` sleeps on the event loop until its slot."""

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take a start: now, or (``blocking``) at the next free slot, sleeping
        until then.  With ``timeout``, a slot further away than that is not
        taken and False comes back at once.  A cancelled sleep spends its slot."""
        slot = await self.take(self.within(blocking, timeout))
        if slot.taken and slot.delay > 0:
            await asyncio.sleep(slot.delay)
        return slot.taken

    async def reserve(self) -> float:
        """Take the next free start, however far away; the seconds until it."""
        return (await self.take(None)).delay

    async def take(self, within: Optional[float]) -> Slot:
        """Take the next free start if it is at most ``within`` seconds away
        (0: now only; None: however far).  The
        :class:`~celery_redislock.primitives.rates.Slot` says whether it was
        taken and when it is (or the next free one is)."""
        call = slot_call(self.key, self.limit, within)
        try:
            reply = await calls.run(self.client, call)
        except UNREACHABLE as exc:
            raise unreachable("acquire", self.key, exc) from exc
        return parse_slot(reply)

    async def __aenter__(self) -> RateLimiter:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Nothing to give back: a start, once taken, is spent."""

    def __repr__(self) -> str:
        return f"<asyncio RateLimiter {self.name!r} {self.limit} burst={self.limit.burst}>"
