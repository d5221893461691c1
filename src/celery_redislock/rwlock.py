"""ReadWriteLock: many readers or one writer, writers preferred.

No Celery import here.  Readers and the writer share one FIFO queue: a
waiting writer stops readers that arrive after it, so a steady stream of
readers cannot starve it, and the readers queued behind a writer all get in
together when it leaves.  Each reader has its own lease, so a crashed
reader blocks writers for at most that lease.
"""

from __future__ import annotations

from typing import Any

from . import keys, scripts
from ._common import call
from .semaphore import Semaphore

__all__ = ["ReadWriteLock"]


class _Side(Semaphore):
    """One hold of a ReadWriteLock; acquire/release/context manager like Lock."""

    RKIND = "rw"

    def __init__(self, client: Any, name: str, mode: str, ttl: float, **options: Any) -> None:
        super().__init__(client, name, 1, ttl, **options)
        self.keys = keys.multi_keys(self.prefix, self.name, self.RKIND)
        self.mode = mode
        self.kind = "read lock" if mode == "r" else "write lock"

    def _extra_args(self) -> list[Any]:
        return [self.mode, 0]


class ReadWriteLock:
    """A read-write lock in Redis: ``with rw.read():`` / ``with rw.write():``.

    Every call of :meth:`read` or :meth:`write` returns a new hold object with
    the Lock interface (``acquire``, ``release``, ``fence``, context manager);
    one round trip per acquire and per release.  Accepts the keyword options
    of :class:`celery_redislock.Lock` (``timeout``, ``prefix``, ...).
    """

    def __init__(self, client: Any, name: str, ttl: float = 30.0, **options: Any) -> None:
        self.client = client
        self.name = name
        self.ttl = ttl
        self.options = options
        self.keys = keys.multi_keys(options.get("prefix", "redislock"), name, _Side.RKIND)
        self.read(), self.write()  # validate the options now, not on first use

    def read(self, **options: Any) -> _Side:
        """A shared hold: any number of readers at once, while no writer holds."""
        return _Side(self.client, self.name, "r", self.ttl, **{**self.options, **options})

    def write(self, **options: Any) -> _Side:
        """An exclusive hold: no readers and no other writer."""
        return _Side(self.client, self.name, "x", self.ttl, **{**self.options, **options})

    def holders(self) -> int:
        """How many readers (or 1 writer) hold it now (one round trip)."""
        return int(
            call(
                "count",
                self.keys.holders,
                scripts.get("multi_count"),
                keys=[self.keys.holders],
                client=self.client,
            )
        )

    def write_locked(self) -> bool:
        """Whether a writer holds it now (one round trip)."""
        writer = call("inspect", self.keys.info, self.client.hget, self.keys.info, "!writer")
        return writer is not None
