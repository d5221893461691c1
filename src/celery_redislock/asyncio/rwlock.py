"""ReadWriteLock: the asyncio face of :class:`celery_redislock.ReadWriteLock`."""

from __future__ import annotations

from typing import Any, Union, cast

from ..primitives.protocol import Kind, Mode
from ..primitives.rwlock import ReadWriteHolds, side_mode
from .semaphore import Semaphore, count_holders

__all__ = ["ReadWriteLock", "Side"]


class Side(Semaphore):
    """One hold of a ReadWriteLock (read or write), with the Lock interface."""

    kind = Kind.RWLOCK

    def __init__(
        self, client: Any, name: str, mode: Union[Mode, str], ttl: float, **options: Any
    ) -> None:
        #: Mode.READ or Mode.WRITE (``"r"`` and ``"x"`` are read as those).
        self.mode = side_mode(mode)
        self.noun = self.mode.noun
        super().__init__(client, name, 1, ttl, **options)
        self.limit = 0  # (the scripts read no limit for a read or write hold)


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
