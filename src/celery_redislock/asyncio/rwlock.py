"""ReadWriteLock: the asyncio face of :class:`celery_redislock.ReadWriteLock`."""

from __future__ import annotations

from typing import Any, cast

from ..primitives.rwlock import ReadWriteHolds, SideState
from .semaphore import Semaphore, count_holders

__all__ = ["ReadWriteLock", "Side"]


class Side(SideState, Semaphore):
    """One hold of a ReadWriteLock (read or write), with the Lock interface."""


class ReadWriteLock(ReadWriteHolds):
    """A read-write lock in Redis, for asyncio: ``async with rw.read():`` /
    ``async with rw.write():``; many readers or one writer, writers preferred.

    The same lock as :class:`celery_redislock.ReadWriteLock`: sync and asyncio
    readers and writers share it.  Every call of :meth:`read` or :meth:`write`
    returns a new hold object with the Lock interface.  Accepts the keyword
    options of :class:`Lock`.
    """

    side = Side

    def read(self, **options: Any) -> Side:
        """A shared hold: any number of readers at once, while no writer holds."""
        return cast(Side, super().read(**options))

    def write(self, **options: Any) -> Side:
        """An exclusive hold: no readers and no other writer."""
        return cast(Side, super().write(**options))

    async def holders(self) -> int:
        """How many readers (or 1 writer) hold it now (one round trip)."""
        return await count_holders(self._probe)

    async def write_locked(self) -> bool:
        """Whether a writer holds it now (one round trip)."""
        command = self.client.hget(self.keys.info, "!writer")
        return await self._probe._redis("inspect", command) is not None
