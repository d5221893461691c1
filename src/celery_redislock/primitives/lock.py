"""Lock: a Redis mutex with fencing tokens, lease renewal and FIFO wakeups."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from .. import transport
from . import _errors, keys, protocol
from ._primitive import Primitive
from .arguments import DEFAULT_FENCE_RETENTION
from .keys import LockKeys, MultiKeys
from .kinds import Kind
from .protocol import DEFAULT_RESERVE_MS, Handoff, decode, to_ms

if TYPE_CHECKING:
    from .unique import Claim

__all__ = ["Lock", "bump_fence", "reap", "release_token"]


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

    kind = Kind.LOCK
    noun = "lock"
    keys: LockKeys

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
    kind: Union[Kind, str, None] = None,
    fence_retention: float = DEFAULT_FENCE_RETENTION,
    claim: Optional[Claim] = None,
) -> bool:
    """Release the holds on ``name`` whose owner token starts with ``owner``.

    For a supervisor (a worker's main process) whose child died holding them;
    ``owner`` must identify that child's holds only.  ``kind``: the
    :class:`Kind` of the primitive (None, "sem" and "rw", its key infixes,
    are read as Kind.LOCK, SEMAPHORE and RWLOCK).  ``claim``: the dead
    run's claim on its unique key, ended in the same call (the caller checks
    it can be, :func:`~celery_redislock.primitives.unique.foldable`).  One
    round trip.  Parked runs it grants are re-published when their
    reservation lapses.
    """
    k = keys.of_kind(Kind.of(kind), prefix, name)
    released, _ = release_token(
        client, k, owner, prefix_match=True, fence_retention=fence_retention, claim=claim
    )
    return released


def release_token(
    client: Any,
    k: LockKeys | MultiKeys,
    token: str,
    *,
    prefix_match: bool = False,
    fence_retention: float = DEFAULT_FENCE_RETENTION,
    reserve_ms: int = DEFAULT_RESERVE_MS,
    claim: Optional[Claim] = None,
) -> tuple[bool, list[Handoff]]:
    """Release the hold of ``token`` (of every token it starts, with
    ``prefix_match``) on the primitive whose keys are ``k``, as its holder
    would: the next in line is served.  Returns whether a hold was released,
    and the parked runs granted, to re-publish.  One round trip."""
    kind = Kind.LOCK if isinstance(k, LockKeys) else Kind.SEMAPHORE  # (same scripts as RWLOCK)
    call = protocol.release(
        kind,
        k,
        token,
        to_ms(fence_retention),
        reserve_ms=reserve_ms,
        claim=claim,
        prefix_match=prefix_match,
    )
    block = transport.KeyBlock(call.keys, transport.encoding_of(client))
    reply = _errors.run(client, "release", protocol.lead_key(k), call.script, block, call.args)
    released = protocol.parse_release(reply)
    return released.held, released.handoffs


def bump_fence(
    client: Any, fence_key: str, fence_retention: float = DEFAULT_FENCE_RETENTION
) -> int:
    """Raise a name's fence past every grant so far, granting nothing; the new
    fence.  After an operator frees a name, the old holder's fence is below
    every later one, so a fenced store refuses its writes.  One round trip."""
    block = transport.KeyBlock([fence_key], transport.encoding_of(client))
    return int(
        _errors.run(client, "release", fence_key, "fence_bump", block, [to_ms(fence_retention)])
    )
