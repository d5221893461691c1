"""The kind of a primitive (:class:`Kind`) and how a hold is taken (:class:`Mode`).

One enum says everything that differs between a Lock, a Semaphore and a
ReadWriteLock: which scripts serve it, the part of its key names after the
hash tag (``sem``, ``rw``), how the park recovery index names it and what
messages call it.  The values on the wire (key infixes, index prefixes,
mode letters) are the ones the library has always written, so keys already
in a store are read as before.
"""

from __future__ import annotations

import enum
from typing import NamedTuple, Optional, Union

__all__ = ["Kind", "Mode", "Scripts"]


class Scripts(NamedTuple):
    """The scripts of one kind of primitive (names of ``lua/<name>.lua``)."""

    acquire: str
    release: str
    cancel: str
    extend: str
    recover: str


_MUTEX = Scripts("lock_acquire", "lock_release", "lock_cancel", "lock_extend", "lock_recover")
_MULTI = Scripts("multi_acquire", "multi_release", "multi_cancel", "multi_extend", "multi_recover")


class Kind(str, enum.Enum):
    """The kind of a primitive: its scripts, its keys and what it is called.

    The value (``"lock"``, ``"semaphore"``, ``"rwlock"``) is the name the
    inspect API and the metrics labels use.
    """

    LOCK = "lock"
    SEMAPHORE = "semaphore"
    RWLOCK = "rwlock"

    def __str__(self) -> str:
        return self.value

    @property
    def noun(self) -> str:
        """What messages call it: "lock", "semaphore", "read-write lock"."""
        return _NOUNS[self]

    @property
    def infix(self) -> Optional[str]:
        """The part of its key names after the tag (``sem``, ``rw``); None for a lock."""
        return _INFIXES[self]

    @property
    def index_prefix(self) -> str:
        """How the park recovery index names it: ``lock:``, ``sem:``, ``rw:`` + name."""
        return _INFIXES[self] or "lock"

    @property
    def scripts(self) -> Scripts:
        return _MUTEX if self is Kind.LOCK else _MULTI

    @property
    def multi(self) -> bool:
        """Whether its holders live in a sorted set (a semaphore, a read-write lock)."""
        return self is not Kind.LOCK

    @classmethod
    def of_infix(cls, infix: Optional[str]) -> Kind:
        """The kind whose key infix is ``infix`` (None, ``"sem"``, ``"rw"``)."""
        for kind, known in _INFIXES.items():
            if known == infix:
                return kind
        raise ValueError(f"no kind of primitive has the key infix {infix!r}")

    @classmethod
    def of_index_prefix(cls, prefix: str) -> Optional[Kind]:
        """The kind a park recovery index member names (``lock``, ``sem``, ``rw``), or None."""
        for kind in cls:
            if kind.index_prefix == prefix:
                return kind
        return None

    @classmethod
    def of(cls, value: Union[Kind, str, None]) -> Kind:
        """A Kind from itself, its value (``"semaphore"``) or its key infix
        (None for a lock, ``"sem"``, ``"rw"``), as older callers name it."""
        if isinstance(value, Kind):
            return value
        if value is None or value in _BY_INFIX:
            return cls.of_infix(value)
        return cls(value)


_NOUNS = {Kind.LOCK: "lock", Kind.SEMAPHORE: "semaphore", Kind.RWLOCK: "read-write lock"}
_INFIXES: dict[Kind, Optional[str]] = {Kind.LOCK: None, Kind.SEMAPHORE: "sem", Kind.RWLOCK: "rw"}
_BY_INFIX = frozenset(i for i in _INFIXES.values() if i is not None)


class Mode(str, enum.Enum):
    """How a semaphore or read-write lock is held; the value is what the scripts read."""

    PERMIT = "s"  #: one of a semaphore's permits
    READ = "r"  #: a shared hold of a read-write lock
    WRITE = "x"  #: the exclusive hold of a read-write lock

    def __str__(self) -> str:
        return self.value

    @property
    def noun(self) -> str:
        """What messages call a hold taken so: "semaphore", "read lock", "write lock"."""
        return _MODE_NOUNS[self]


_MODE_NOUNS = {Mode.PERMIT: "semaphore", Mode.READ: "read lock", Mode.WRITE: "write lock"}
