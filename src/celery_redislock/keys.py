"""Pure functions that turn lock names and argument values into Redis keys.

Every key of one lock shares one Redis Cluster hash tag, ``{<prefix>:<name>}``,
so every script touching a lock runs unchanged on Redis Cluster.  Names that
are long or contain braces are replaced by a digest inside the tag, so any
name of any length or characters is safe.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

__all__ = ["MAX_PLAIN_NAME", "LockKeys", "digest", "lock_keys", "tag"]

#: Names longer than this many characters are digested rather than spelled out.
MAX_PLAIN_NAME = 200


def digest(data: str | bytes, length: int = 32) -> str:
    """A short, stable hex digest of ``data`` (sha256, truncated)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:length]


def tag(prefix: str, name: str) -> str:
    """The hash-tagged base of every key of lock ``name``: ``prefix:{name}``.

    A name that could break the hash tag (braces), is very long, or starts
    with ``#`` (the digest marker) is replaced by ``#<digest>``, so two
    different names never share a tag.
    """
    if "{" in name or "}" in name or name.startswith("#") or len(name) > MAX_PLAIN_NAME:
        name = "#" + digest(name)
    return f"{prefix}:{{{name}}}"


class LockKeys(NamedTuple):
    """The Redis keys of one lock, all in one hash slot."""

    lock: str  # string: the owner token, with a millisecond lease (PX)
    fence: str  # counter: the fencing token of the latest grant; never expires
    queue: str  # sorted set: waiting owner tokens, scored by arrival (FIFO)
    meta: str  # hash: waiting owner token -> "deadline_ms:ttl_ms"
    wake: str  # prefix of per-waiter lists the release pushes the fence to

    @property
    def script_keys(self) -> list[str]:
        return [self.lock, self.fence, self.queue, self.meta]


def lock_keys(prefix: str, name: str) -> LockKeys:
    base = tag(prefix, name)
    return LockKeys(
        lock=f"{base}:lock",
        fence=f"{base}:fence",
        queue=f"{base}:queue",
        meta=f"{base}:qmeta",
        wake=f"{base}:wake:",
    )
