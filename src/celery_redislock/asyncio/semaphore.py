"""Semaphore: the asyncio face of :class:`celery_redislock.Semaphore`."""

from __future__ import annotations

from ..primitives import protocol
from ..primitives.keys import MultiKeys
from ..primitives.semaphore import PermitState
from .primitive import Primitive

__all__ = ["Semaphore", "count_holders"]


async def count_holders(prim: Semaphore) -> int:
    """Live holders of the semaphore or read-write lock of ``prim`` (one round trip)."""
    return int(await prim._call("count", protocol.count_holders(prim.keys)))


class Semaphore(PermitState, Primitive):
    """A counting semaphore in Redis, for asyncio: at most ``limit`` holders.

    The same semaphore as :class:`celery_redislock.Semaphore` (keys,
    scripts, queue, fences): sync and asyncio holders share its permits.
    One object holds at most one permit; use one object per concurrent
    holder.  Accepts the keyword options of :class:`Lock`.
    """

    keys: MultiKeys

    async def holders(self) -> int:
        """How many holders have a live lease now (one round trip)."""
        return await count_holders(self)

    async def owned(self) -> bool:
        """Whether this object holds a live permit, as Redis sees it (one round trip)."""
        if self._token is None:
            return False
        return bool(int(await self._call("owned", protocol.owned(self.keys, self._token))))
