"""Lock: the asyncio face of :class:`celery_redislock.Lock`."""

from __future__ import annotations

from ..primitives.keys import LockKeys
from ..primitives.protocol import Kind, decode
from .primitive import Primitive

__all__ = ["Lock"]


class Lock(Primitive):
    """A mutex held in Redis by at most one owner at a time, for asyncio.

    The same lock as :class:`celery_redislock.Lock`: same keys, scripts,
    queue and fences, so sync and asyncio holders of one name exclude each
    other, hand over to each other in FIFO order, and share one rising
    :attr:`fence`.  ``await acquire()`` and ``await release()`` take one round
    trip each when the lock is free; a blocked ``acquire()`` waits for its
    wake-up (BLPOP on a connection of its own) without polling and without
    blocking the event loop.  While held, the event loop's renewal task
    renews the lease every ``renew_interval`` seconds (default ``ttl / 3``).

    :param client: a ``redis.asyncio.Redis`` (also Sentinel's ``master_for``)
        or ``redis.asyncio.cluster.RedisCluster``.
    :param name: any non-empty string.
    :param ttl: the lease in seconds.
    :param prefix: prefix of every Redis key of the lock.
    :param timeout: how long ``async with lock:`` waits before raising
        LockTimeout (None: forever).
    :param renew: renew the lease in the background while held.
    :param renew_interval: seconds between renewals (default ``ttl / 3``).
    :param owner: a prefix for the owner token.
    :param on_lost: called with ``(lock, reason)`` when renewal finds the lease gone.
    :param fence_retention: how long the fence key outlives the last grant, s.
    """

    kind = Kind.LOCK
    noun = "lock"
    keys: LockKeys

    async def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        return bool(await self._redis("locked", self.client.exists(self.key)))

    async def owned(self) -> bool:
        """Whether this object holds the lock now, as Redis sees it (one round trip)."""
        if self._token is None:
            return False
        value = await self._redis("owned", self.client.get(self.key))
        return value is not None and decode(value) == self._token
