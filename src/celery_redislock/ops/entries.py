"""What the inspect API returns: one typed record per thing the library keeps.

Plain frozen dataclasses, built by :mod:`.reading` from the store and turned
into the stable JSON of ``celery redislock ls --json`` by :meth:`Entry.as_dict`
(and friends).  Times are in milliseconds, as the store keeps them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Optional

from ..tasks.owners import parse_owner

__all__ = ["Entry", "Holder", "Kind", "ParkedRun", "Stats", "UniqueJobs", "Waiter"]


class Kind(str, enum.Enum):
    """What kind of thing a name is; a name may be more than one at once (a
    task's run lock and its unique key share the task's lock key)."""

    LOCK = "lock"
    SEMAPHORE = "semaphore"
    RWLOCK = "rwlock"
    UNIQUE = "unique"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Holder:
    """One hold: the mutex's holder, a semaphore permit, a read or write side.

    ``task_id``, ``task_name``, ``hostname`` (the worker's node name, as in
    ``request.hostname``) and ``pid`` are read from the holder's token (see
    :mod:`celery_redislock.tasks.owners`); they are None for a holder that is
    not a task run.  ``parked``: granted to a parked run that is on its way
    to a worker (in flight), which runs nowhere yet: no hostname or pid.
    """

    token: str
    mode: str  # "exclusive", "permit", "read" or "write"
    fence: Optional[int]
    ttl_ms: Optional[int]  # what is left of the lease
    held_ms: Optional[int]  # since the grant (read from the fence, the server's clock in µs)
    task_id: Optional[str] = None
    task_name: Optional[str] = None
    hostname: Optional[str] = None
    pid: Optional[int] = None
    parked: bool = False

    @classmethod
    def of(
        cls,
        token: str,
        mode: str,
        fence: Optional[int],
        ttl_ms: Optional[int],
        now_us: int,
        in_flight: bool = False,
    ) -> Holder:
        owner = parse_owner(token)
        if in_flight:
            owner = owner._replace(hostname=None, pid=None)
        held = None
        # A fence is the server's clock at the grant, or one more than the
        # last fence when that was higher: close enough to date the grant.
        if fence is not None and 0 < now_us - fence < 10**13:
            held = (now_us - fence) // 1000
        return cls(token, mode, fence, ttl_ms, held, *owner, parked=in_flight)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Waiter:
    """A caller blocked in a primitive's FIFO line (``parked`` runs are listed
    as :class:`ParkedRun`)."""

    token: str
    mode: str
    waited_ms: int
    task_id: Optional[str] = None
    task_name: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ParkedRun:
    """A task run parked in a primitive's line (``on_contention="park"``).

    ``id`` is its parked token, what ``parked drop`` and ``parked republish``
    take.  ``position`` counts from 0 at the head of the line; a run already
    granted and on its way to a worker is ``in_flight`` (position None).
    """

    id: str
    name: str
    kind: Kind
    task_id: Optional[str]
    task_name: Optional[str]
    position: Optional[int]
    waited_ms: Optional[int]
    in_flight: bool

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kind"] = self.kind.value
        return d


@dataclasses.dataclass(frozen=True)
class UniqueJobs:
    """Who holds a unique key (see the unique-jobs options): the job waiting
    to start, the job running, the job a throttle window admitted."""

    waiting: Optional[str]
    waiting_ttl_ms: int
    running: Optional[str]
    running_ttl_ms: int
    throttled_by: Optional[str]
    throttle_ttl_ms: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One name of one kind, as the store has it now.

    ``name`` is the lock name as the task gave it, or ``#<digest>`` for a name
    the store keeps digested (longer than 200 characters, or with braces).
    ``fence`` is the last grant's; ``limit`` a semaphore's; ``waiters`` counts
    blocked callers, ``parked`` parked runs (in flight included),
    ``writers_waiting`` the write side's waiters of a read-write lock.
    """

    kind: Kind
    name: str
    key: str  # the hash-tagged base of the name's keys
    holders: tuple[Holder, ...] = ()
    fence: Optional[int] = None
    limit: Optional[int] = None
    waiters: int = 0
    parked: int = 0
    writers_waiting: int = 0
    unique: Optional[UniqueJobs] = None

    @property
    def held(self) -> bool:
        if self.kind is Kind.UNIQUE:
            return self.unique is not None and bool(
                self.unique.waiting or self.unique.running or self.unique.throttled_by
            )
        return bool(self.holders)

    def as_dict(self) -> dict[str, Any]:
        """The entry as JSON-ready data: the schema ``ls --json`` prints."""
        return {
            "kind": self.kind.value,
            "name": self.name,
            "key": self.key,
            "holders": [h.as_dict() for h in self.holders],
            "fence": self.fence,
            "limit": self.limit,
            "waiters": self.waiters,
            "parked": self.parked,
            "writers_waiting": self.writers_waiting,
            "unique": self.unique.as_dict() if self.unique else None,
        }


@dataclasses.dataclass(frozen=True)
class Stats:
    """A summary for ``celery redislock stats``."""

    counts: dict[str, int]  # per kind, names that exist
    held: dict[str, int]  # per kind, names held now
    holders: int
    waiters: int
    parked: int
    oldest: Optional[tuple[Entry, Holder]]  # the longest-held hold
    longest_line: Optional[Entry]  # the most waiters and parked runs

    def as_dict(self) -> dict[str, Any]:
        oldest = None
        if self.oldest is not None:
            entry, holder = self.oldest
            oldest = {"kind": entry.kind.value, "name": entry.name, "holder": holder.as_dict()}
        line = self.longest_line
        longest = None
        if line is not None:
            longest = {
                "kind": line.kind.value,
                "name": line.name,
                "waiting": line.waiters + line.parked,
            }
        return {
            "counts": self.counts,
            "held": self.held,
            "holders": self.holders,
            "waiters": self.waiters,
            "parked": self.parked,
            "oldest": oldest,
            "longest_line": longest,
        }
