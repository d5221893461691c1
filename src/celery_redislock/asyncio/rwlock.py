"""ReadWriteLock: the asyncio face of :class:`celery_redislock.ReadWriteLock`."""

from __future__ import annotations

from typing import Any

from ..primitives import keys
from ..primitives.keys import MultiKeys
from ..primitives.protocol import Kind, Mode
from .primitive import Primitive
from .semaphore import count_holders

__all__ = ["ReadWriteLock", "Side"]


class Side(Primitive):
    """One hold of a ReadWriteLock (read or write), with the Lock interface."""

    kind = Kind.RWLOCK
    keys: MultiKeys

    def __init__(self, client: Any, name: str, mode: Mode, ttl: float, **options: Any) -> None:
        self.mode = mode
        super().__init__(client, name, ttl, **options)
        self.keys = keys.multi_keys(self.prefix, self.name, self.kind.infix or "")

    @property
    def noun(self) -> str:
        return self.mode.noun

    def _acquire_options(self) -> dict[str, Any]:
        return {"mode": self.mode, "limit": 0}


class ReadWriteLock:
    """A read-write lock in Redis, for asyncio: ``async with rw.read():`` /
    ``async with rw.write():``; many readers or one writer, writers preferred.

    The same lock as :class:`celery_redislock.ReadWriteLock`: sync and asyncio
    readers and writers share it.  Every call of :meth:`read` or :meth:`write`
    returns a new hold object with the Lock interface.  Accepts the keyword
    options of :class:`Lock`.
    """

    def __init__(self, client: Any, name: str, ttl: float = 30.0, **options: Any) -> None:
        self.client = client
        self.name = name
        self.ttl = ttl
        self.options = options
        self._probe = self.write()  # validates the options now, not on first use
        self.read()
        self.keys = self._probe.keys

    def read(self, **options: Any) -> Side:
        """A shared hold: any number of readers at once, while no writer holds."""
        return Side(self.client, self.name, Mode.READ, self.ttl, **{**self.options, **options})

    def write(self, **options: Any) -> Side:
        """An exclusive hold: no readers and no other writer."""
        return Side(self.client, self.name, Mode.WRITE, self.ttl, **{**self.options, **options})

    async def holders(self) -> int:
        """How many readers (or 1 writer) hold it now (one round trip)."""
        return await count_holders(self._probe)

    async def write_locked(self) -> bool:
        """Whether a writer holds it now (one round trip)."""
        command = self.client.hget(self.keys.info, "!writer")
        return await self._probe._redis("inspect", command) is not None
