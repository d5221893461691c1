"""Pure functions that turn primitive names into Redis keys.

Every key of one primitive shares one Redis Cluster hash tag, ``{<name>}``
after the prefix, so every script touching it runs unchanged on Redis
Cluster.  Names that are long or contain braces are replaced by a digest
inside the tag, so any name of any length or characters is safe.  Locks,
semaphores and read-write locks of the same name use different key suffixes
and never collide.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple, Union

from ..exceptions import ConfigurationError
from .kinds import Kind

__all__ = [
    "MAX_PLAIN_NAME",
    "LockKeys",
    "MultiKeys",
    "digest",
    "lock_keys",
    "lock_keys_at",
    "multi_keys",
    "multi_keys_at",
    "of_kind",
    "of_kind_at",
    "rate_key",
    "tag",
    "unique_key",
]

#: Names longer than this many characters are digested rather than spelled out.
MAX_PLAIN_NAME = 200


def digest(data: str | bytes, length: int = 32) -> str:
    """A short, stable hex digest of ``data`` (sha256, truncated)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:length]


def tag(prefix: str, name: str) -> str:
    """The hash-tagged base of every key of ``name``: ``prefix:{name}``.

    A name that could break the hash tag (braces), is very long, cannot be
    encoded (lone surrogates) or starts with ``#`` (the digest marker) is
    replaced by ``#<digest>``, so two different names never share a tag.
    A prefix with braces is refused: it would move the tag.
    """
    if "{" in prefix or "}" in prefix:
        raise ConfigurationError(
            f"key prefix must not contain braces (it would break the hash tag), got {prefix!r}"
        )
    if (
        "{" in name
        or "}" in name
        or name.startswith("#")
        or len(name) > MAX_PLAIN_NAME
        or not (name.isascii() or _encodable(name))
    ):
        name = "#" + digest(name)
    return f"{prefix}:{{{name}}}"


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: digest them instead
        return False
    return True


class LockKeys(NamedTuple):
    """The Redis keys of one mutex, all in one hash slot."""

    lock: str  # string: the owner token, with a millisecond lease (PX)
    fence: str  # counter: the fencing token of the latest grant; never expires
    queue: str  # sorted set: waiting tokens, scored by arrival (FIFO)
    meta: str  # hash: waiting token -> "deadline_ms:lease_ms:kind:mode"
    pmsg: str  # hash: parked token -> task payload, until its run claims it
    inflight: str  # sorted set: granted parked token -> reservation deadline
    wake: str  # prefix of per-waiter lists the release pushes the fence to

    @property
    def script_keys(self) -> list[str]:
        return [self.lock, self.fence, self.queue, self.meta, self.pmsg, self.inflight]


class MultiKeys(NamedTuple):
    """The Redis keys of one semaphore or read-write lock, all in one hash slot."""

    holders: str  # sorted set: holder token -> lease expiry (server ms)
    fence: str
    queue: str
    meta: str
    pmsg: str
    inflight: str
    info: str  # hash: holder token -> fence, '!limit', '!writer'
    wake: str

    @property
    def script_keys(self) -> list[str]:
        return [
            self.holders,
            self.fence,
            self.queue,
            self.meta,
            self.pmsg,
            self.inflight,
            self.info,
        ]


def _queue_keys(base: str) -> tuple[str, str, str, str, str, str]:
    """The keys every primitive has: fence, FIFO queue (queue, meta), parked
    tasks (pmsg, inflight), wake lists; a tuple, as a task builds them per run."""
    return (
        f"{base}:fence",
        f"{base}:queue",
        f"{base}:qmeta",
        f"{base}:parked",
        f"{base}:inflight",
        f"{base}:wake:",
    )


def lock_keys(prefix: str, name: str) -> LockKeys:
    return lock_keys_at(tag(prefix, name))


def lock_keys_at(base: str) -> LockKeys:
    """Keys of the mutex whose tagged base (see :func:`tag`) is ``base``."""
    return LockKeys(f"{base}:lock", *_queue_keys(base))


def multi_keys(prefix: str, name: str, kind: Union[Kind, str]) -> MultiKeys:
    """Keys of semaphore or read-write lock ``name`` (``kind`` a Kind, or its
    key infix: ``"sem"``, ``"rw"``)."""
    return multi_keys_at(tag(prefix, name), kind)


def multi_keys_at(base: str, kind: Union[Kind, str]) -> MultiKeys:
    """Keys of the semaphore or read-write lock whose tagged base is ``base``."""
    infix = kind.infix if isinstance(kind, Kind) else kind
    if not infix:
        raise ValueError(f"a {kind} has no semaphore or read-write lock keys")
    base = f"{base}:{infix}"
    fence, queue, meta, pmsg, inflight, wake = _queue_keys(base)
    return MultiKeys(f"{base}:holders", fence, queue, meta, pmsg, inflight, f"{base}:info", wake)


def of_kind(kind: Kind, prefix: str, name: str) -> Union[LockKeys, MultiKeys]:
    """The keys of the primitive of ``kind`` called ``name``."""
    return of_kind_at(kind, tag(prefix, name))


def of_kind_at(kind: Kind, base: str) -> Union[LockKeys, MultiKeys]:
    """The keys of the primitive of ``kind`` whose tagged base is ``base``."""
    return lock_keys_at(base) if kind is Kind.LOCK else multi_keys_at(base, kind)


def unique_key(prefix: str, name: str) -> str:
    """The hash of unique key ``name`` (publish-side uniqueness; see _claim.lua).

    A run lock of the same name shares its hash tag, so the lock's scripts
    can carry the claim on Redis Cluster too.
    """
    return f"{tag(prefix, name)}:unique"


def rate_key(prefix: str, name: str) -> str:
    """The key of rate limit ``name``: the theoretical arrival time of its next
    start (see lua/rate_acquire.lua).  A lock of the same name shares its hash tag."""
    return f"{tag(prefix, name)}:rate"
