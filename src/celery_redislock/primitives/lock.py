"""Lock: a Redis mutex with fencing tokens, lease renewal and FIFO wakeups."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .. import transport
from . import _scripts, keys
from ._base import (
    DEFAULT_FENCE_RETENTION,
    DEFAULT_RESERVE_MS,
    Primitive,
    decode,
    to_ms,
    unreachable,
)
from .keys import LockKeys

if TYPE_CHECKING:
    from .unique import Claim

__all__ = ["Lock", "reap"]


class Lock(Primitive):
    """A mutex held in Redis by at most one owner at a time.

    ``acquire()`` and ``release()`` take one round trip each when the lock is
    free.  A blocked ``acquire()`` queues in FIFO order and is woken by the
    release (which hands the lock straight to the first live waiter), never by
    polling; its wait is bounded by the holder's remaining lease, so a crashed
    holder costs at most its lease.  While held, the per-process keeper renews
    the lease every ``renew_interval`` seconds (default ``ttl / 3``); a Lock
    dropped without ``release()`` stops being renewed and its lease runs out.

    Every grant returns a fencing token, :attr:`fence`, that only goes up for a
    given lock name; pass it to downstream stores to reject stale writers.

    :param client: a ``redis.Redis`` (or ``RedisCluster``) client.
    :param name: any non-empty string.
    :param ttl: the lease in seconds.
    :param prefix: prefix of every Redis key of the lock.
    :param timeout: how long ``with lock:`` waits before raising LockTimeout
        (None: forever).
    :param renew: renew the lease in the background while held.
    :param renew_interval: seconds between renewals (default ``ttl / 3``).
    :param owner: a prefix for the owner token (LockedTask puts the task id here).
    :param on_lost: called with ``(lock, reason)`` when renewal finds the lease gone.
    """

    kind = "lock"
    ACQUIRE = "lock_acquire"
    RELEASE = "lock_release"
    CANCEL = "lock_cancel"
    EXTEND = "lock_extend"
    keys: LockKeys

    def __init__(self, client: Any, name: str, ttl: float = 30.0, **options: Any) -> None:
        super().__init__(client, name, ttl, **options)
        self.keys = keys.lock_keys(self.prefix, self.name)

    @property
    def key(self) -> str:
        return self.keys.lock

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        return bool(self._redis("locked", self.client.exists, self.key))

    def owned(self) -> bool:
        """Whether this object holds the lock now, as Redis sees it (one round trip)."""
        if self._token is None:
            return False
        value = self._redis("owned", self.client.get, self.key)
        return value is not None and decode(value) == self._token


def reap(
    client: Any,
    name: str,
    owner: str,
    *,
    prefix: str = "redislock",
    kind: Optional[str] = None,
    fence_retention: float = DEFAULT_FENCE_RETENTION,
    claim: Optional[Claim] = None,
) -> bool:
    """Release the holds on ``name`` whose owner token starts with ``owner``.

    For a supervisor (a worker's main process) whose child died holding them;
    ``owner`` must identify that child's holds only.  ``kind`` None reaps a
    Lock; "sem" or "rw" a Semaphore or ReadWriteLock.  ``claim``: the dead
    run's claim on its unique key, ended in the same call (the caller checks
    it can be, :func:`~celery_redislock.primitives.unique.foldable`).  One
    round trip.
    """
    if kind is None:
        k: Any = keys.lock_keys(prefix, name)
        script, key = _scripts.get("lock_release"), k.lock
    else:
        k = keys.multi_keys(prefix, name, kind)
        script, key = _scripts.get("multi_release"), k.holders
    block_keys = list(k.script_keys) + ([claim.key] if claim is not None else [])
    block = transport.KeyBlock(block_keys, transport.encoding_of(client))
    try:
        args = [owner, k.wake, to_ms(fence_retention), 1, DEFAULT_RESERVE_MS]
        if claim is not None:
            args.append(claim.arg())
        reply = transport.call(client, script, block, args)
    except transport.UNREACHABLE as exc:
        raise unreachable("reap", key, exc) from exc
    return reply == 1 or bool(int(reply[0]))
