"""The inspect API: see what the library keeps in Redis, and clear what is stuck.

>>> from celery_redislock.inspect import Inspector
>>> inspector = Inspector.from_app(app)          # or Inspector(redis_client, prefix)
>>> for entry in inspector.entries():            # every lock, semaphore, rwlock, unique key
...     print(entry.kind, entry.name, [h.task_id for h in entry.holders])
>>> inspector.release("sync-42")                 # frees it and raises its fence

Reading never changes anything; it uses SCAN and pipelines (see
:mod:`.reading`).  Freeing and dropping go through the library's own
scripts (see :mod:`.clearing`).  Made from a Celery app, the inspector
re-publishes the parked runs a release grants at once; made from a bare
client, a worker's sweeper does, once their reservation lapses.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import config
from ..tasks import parking
from . import clearing, reading
from .clearing import Dropped, Released
from .entries import Entry, Holder, Kind, ParkedRun, Stats, UniqueJobs, Waiter

#: The settings' defaults, for an inspector made from a bare client.
_DEFAULTS = config.Settings()

__all__ = [
    "Dropped",
    "Entry",
    "Holder",
    "Inspector",
    "Kind",
    "ParkedRun",
    "Released",
    "Stats",
    "UniqueJobs",
    "Waiter",
]


class Inspector:
    """Reads and clears the locks, semaphores, read-write locks, unique keys
    and parked runs kept under ``prefix`` in the Redis of ``client``."""

    def __init__(
        self,
        client: Any,
        prefix: str = "redislock",
        *,
        app: Any = None,
        fence_retention: float = _DEFAULTS.fence_retention,
        park_reserve: float = _DEFAULTS.park_reserve,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.app = app
        self.fence_retention = fence_retention
        self.reserve_ms = max(1, int(park_reserve * 1000))

    @classmethod
    def from_app(cls, app: Any) -> Inspector:
        """The lock store, prefix and settings of ``app``, as its workers use them."""
        settings = config.settings_for(app)
        return cls(
            config.client_for(app),
            settings.key_prefix,
            app=app,
            fence_retention=settings.fence_retention,
            park_reserve=settings.park_reserve,
        )

    # -- reading ---------------------------------------------------------------

    def entries(self, pattern: str = "*", kind: Optional[Kind | str] = None) -> list[Entry]:
        """Every name in use whose name matches the glob ``pattern``, of
        ``kind`` (every kind when None), sorted by kind and name."""
        wanted = None if kind is None else Kind(kind)
        found = reading.scan(self.client, self.prefix, pattern)
        names = [nk for nk in found if wanted is None or nk[1] is wanted]
        names.sort(key=lambda nk: (list(Kind).index(nk[1]), nk[0]))
        return list(reading.read(self.client, self.prefix, names, found))

    def show(self, name: str, kind: Optional[Kind | str] = None) -> list[Entry]:
        """The entries of one name (a name may be a lock and a unique key at once)."""
        wanted = None if kind is None else Kind(kind)
        found = [(n, k) for n, k in reading.find(self.client, self.prefix, name)]
        return list(
            reading.read(self.client, self.prefix, [nk for nk in found if wanted in (None, nk[1])])
        )

    def waiters(self, entry: Entry) -> list[Waiter]:
        """The callers blocked in ``entry``'s line, head first."""
        return reading.details(self.client, self.prefix, entry)[0]

    def parked(self, name: Optional[str] = None) -> list[ParkedRun]:
        """The parked runs of ``name`` (of every name when None), in line order."""
        entries = self.show(name) if name is not None else self.entries()
        runs: list[ParkedRun] = []
        for entry in entries:
            if entry.kind is not Kind.UNIQUE and entry.parked:
                runs += reading.details(self.client, self.prefix, entry)[1]
        return runs

    def parked_index(self) -> list[tuple[str, int]]:
        """The recovery index of names with parked runs: ``("kind:name", next
        check in server ms)``, the sweepers' work list."""
        members = self.client.zrange(parking.index_key(self.prefix), 0, -1, withscores=True)
        return [(reading.text(m), int(score)) for m, score in members]

    def stats(self, entries: Optional[list[Entry]] = None) -> Stats:
        """Counts per kind, the longest-held hold and the longest line."""
        entries = self.entries() if entries is None else entries
        counts = {k.value: 0 for k in Kind}
        held = {k.value: 0 for k in Kind}
        oldest: Optional[tuple[Entry, Holder]] = None
        longest: Optional[Entry] = None
        for e in entries:
            counts[e.kind.value] += 1
            held[e.kind.value] += e.held
            for h in e.holders:
                if h.held_ms is not None and (
                    oldest is None or h.held_ms > (oldest[1].held_ms or 0)
                ):
                    oldest = (e, h)
            line = e.waiters + e.parked
            if line and (longest is None or line > longest.waiters + longest.parked):
                longest = e
        return Stats(
            counts,
            held,
            sum(len(e.holders) for e in entries),
            sum(e.waiters for e in entries),
            sum(e.parked for e in entries),
            oldest,
            longest,
        )

    # -- clearing --------------------------------------------------------------

    def release(
        self, name: str, kind: Optional[Kind | str] = None, *, holder: Optional[str] = None
    ) -> list[Released]:
        """Free ``name`` (every kind it is in use as, or ``kind``) and raise
        its fence; with ``holder`` (a token or task id), only that hold.
        Returns what was done per kind; the new fence is on each."""
        return [
            clearing.release(
                self.client,
                entry,
                holder=holder,
                fence_retention=self.fence_retention,
                reserve_ms=self.reserve_ms,
                republish=self._republisher(),
            )
            for entry in self.show(name, kind)
        ]

    def drop_parked(self, run_id: str) -> Optional[ParkedRun]:
        """Take parked run ``run_id`` out of its line for good (and its job's
        unique key, when it holds one); None if no line holds it.  Made from
        an app, the run's result says REVOKED."""
        dropped = self._drop(run_id)
        if dropped is None:
            return None
        clearing.drop_unique_claim(self.client, dropped)
        if self.app is not None:
            clearing.mark_dropped(self.app, dropped)
        return dropped.run

    def republish_parked(self, run_id: str) -> Optional[str]:
        """Publish parked run ``run_id`` again now, as a new contender (it parks
        again, in its place, if the lock is still held); its task id, or
        None if no line holds it.  Needs an inspector made from an app."""
        if self.app is None:
            raise TypeError("republishing a parked run needs Inspector.from_app(app)")
        dropped = self._drop(run_id)
        return None if dropped is None else clearing.republish(self.app, dropped)

    def _drop(self, run_id: str) -> Optional[Dropped]:
        return clearing.drop_parked(
            self.client,
            self.prefix,
            run_id,
            fence_retention=self.fence_retention,
            reserve_ms=self.reserve_ms,
            republish=self._republisher(),
        )

    def _republisher(self) -> Optional[clearing.Republisher]:
        return None if self.app is None else parking.publisher(self.app)
