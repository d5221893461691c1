"""ReadWriteLock: many readers or one writer, writers preferred.

Readers and the writer share one FIFO queue: a waiting writer stops readers
that arrive after it, so a steady stream of readers cannot starve it, and
the readers queued behind a writer all get in together when it leaves.  Each
reader has its own lease, so a crashed reader blocks writers for at most
that lease.
"""

from __future__ import annotations

from typing import Any, ClassVar, Union, cast

from .kinds import Kind, Mode
from .semaphore import PermitState, Semaphore, count_holders

__all__ = ["ReadWriteHolds", "ReadWriteLock", "Side", "SideState", "side_mode"]


def side_mode(mode: Union[Mode, str]) -> Mode:
    """The mode of a side: Mode.READ or Mode.WRITE (``"r"`` and ``"x"`` are read as those)."""
    found = Mode(mode)
    if found is Mode.PERMIT:
        raise ValueError("a side of a read-write lock is taken in Mode.READ or Mode.WRITE")
    return found


class SideState(PermitState):
    """What a side of a read-write lock is in either driver: its kind and mode."""

    kind = Kind.RWLOCK

    def __init__(
        self, client: Any, name: str, mode: Union[Mode, str], ttl: float, **options: Any
    ) -> None:
        #: Mode.READ or Mode.WRITE (``"r"`` and ``"x"`` are read as those).
        self.mode = side_mode(mode)
        self.noun = self.mode.noun
        super().__init__(client, name, 1, ttl, **options)
        self.limit = 0  # (the scripts read no limit for a read or write hold)


class Side(SideState, Semaphore):
    """One hold of a ReadWriteLock; acquire/release/context manager like Lock."""


class ReadWriteHolds:
    """A read-write lock's name and options, and a hold object per side: what
    the sync and the asyncio ReadWriteLock share (``side`` is their Side class)."""

    side: ClassVar[type[Any]]

    def __init__(self, client: Any, name: str, ttl: float = 30.0, **options: Any) -> None:
        self.client = client
        self.name = name
        self.ttl = ttl
        self.options = options
        self._probe = self.write()  # validates the options now, not on first use
        self.read()
        self.keys = self._probe.keys

    def read(self, **options: Any) -> Any:
        """A shared hold: any number of readers at once, while no writer holds."""
        return self.side(self.client, self.name, Mode.READ, self.ttl, **{**self.options, **options})

    def write(self, **options: Any) -> Any:
        """An exclusive hold: no readers and no other writer."""
        return self.side(
            self.client, self.name, Mode.WRITE, self.ttl, **{**self.options, **options}
        )


class ReadWriteLock(ReadWriteHolds):
    """A read-write lock in Redis: ``with rw.read():`` / ``with rw.write():``.

    Every call of :meth:`read` or :meth:`write` returns a new hold object with
    the Lock interface (``acquire``, ``release``, ``fence``, context manager);
    one round trip per acquire and per release.  Accepts the keyword options
    of :class:`celery_redislock.Lock` (``timeout``, ``prefix``, ...).
    """

    side = Side

    def read(self, **options: Any) -> Side:
        """A shared hold: any number of readers at once, while no writer holds."""
        return cast(Side, super().read(**options))

    def write(self, **options: Any) -> Side:
        """An exclusive hold: no readers and no other writer."""
        return cast(Side, super().write(**options))

    def holders(self) -> int:
        """How many readers (or 1 writer) hold it now (one round trip)."""
        return count_holders(self.client, self.keys)

    def write_locked(self) -> bool:
        """Whether a writer holds it now (one round trip)."""
        info = self.keys.info
        return self._probe._redis("inspect", self.client.hget, info, "!writer") is not None
