"""Lock: a Redis mutex with fencing tokens, lease renewal and FIFO wakeups.

No Celery import here: the primitives work in any Python process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Optional

from . import _common, keys, renewal, scripts
from ._common import FOREVER_MS, GRACE_MS, call, decode, to_ms
from .exceptions import ConfigurationError, LockError, LockLost, LockNotOwned, LockTimeout

__all__ = ["Lock", "reap"]


class Lock:
    """A mutex held in Redis by at most one owner at a time.

    ``acquire()`` and ``release()`` take one round trip each when the lock is
    free.  A blocked ``acquire()`` queues in FIFO order and is woken by the
    release (which hands the lock straight to the first live waiter), never by
    polling; its wait is bounded by the holder's remaining lease, so a crashed
    holder costs at most its lease.  While held, the per-process keeper renews
    the lease every ``renew_interval`` seconds (default ``ttl / 3``).

    Every grant returns a fencing token, :attr:`fence`, that only goes up for a
    given lock name; pass it to downstream stores to reject stale writers.

    :param client: a ``redis.Redis`` (or ``RedisCluster``) client.
    :param name: any non-empty string.
    :param ttl: the lease in seconds.
    :param prefix: prefix of every Redis key of the lock.
    :param timeout: how long ``with lock:`` waits before raising LockTimeout
        (None: forever).
    :param renew: renew the lease in the background while held.
    :param owner: a prefix for the owner token (LockedTask puts the task id here).
    :param on_lost: called with ``(lock, reason)`` when renewal finds the lease gone.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: float = 30.0,
        *,
        prefix: str = "redislock",
        timeout: Optional[float] = None,
        renew: bool = True,
        renew_interval: Optional[float] = None,
        owner: str = "",
        on_lost: Optional[Callable[[Lock, str], None]] = None,
    ) -> None:
        self.client = client
        self.name = _common.check_name(name, "Lock name")
        self.ttl = float(_common.check_seconds(ttl, f"ttl of lock {name!r}") or 0)
        self.timeout = _common.check_seconds(timeout, f"timeout of lock {name!r}", allow_none=True)
        interval = _common.check_seconds(
            renew_interval, f"renew_interval of lock {name!r}", allow_none=True
        )
        if interval is not None and interval >= self.ttl:
            raise ConfigurationError(
                f"renew_interval of lock {name!r} must be shorter than its ttl "
                f"({self.ttl}), got {interval!r}"
            )
        self.renew_interval = interval if interval is not None else self.ttl / 3
        self.renew = renew
        self.owner = owner
        self.on_lost = on_lost
        self.keys = keys.lock_keys(_common.check_name(prefix, "prefix"), name)
        self.key = self.keys.lock
        #: Fencing token of the current hold, or None when not held.
        self.fence: Optional[int] = None
        #: True once renewal (or release) found that the lease ran out while held.
        self.lost = False
        #: The holder's token and remaining lease (ms) seen by the last failed acquire.
        self.holder: Optional[str] = None
        self.holder_ttl_ms: Optional[int] = None
        self._token: Optional[str] = None

    def __repr__(self) -> str:
        state = f"held fence={self.fence}" if self._token else "not held"
        return f"<Lock {self.name!r} {state}>"

    @property
    def token(self) -> Optional[str]:
        """The owner token of the current hold, or None."""
        return self._token

    # -- acquire ---------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take the lock; return True when held, False when not (non-blocking or timeout).

        ``timeout`` None with ``blocking`` waits forever.
        """
        if self._token is not None:
            raise LockError(f"lock {self.name!r} is already held by this Lock object", self.key)
        if timeout is not None:
            if not blocking:
                raise ValueError("can't specify a timeout for a non-blocking acquire")
            _common.check_seconds(timeout, f"acquire timeout of lock {self.name!r}")
        token = _common.new_token(self.owner)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        script = scripts.get("lock_acquire")
        cap = _common.block_cap(self.client)
        wake_key = self.keys.wake + token
        ttl_ms = to_ms(self.ttl)

        def ask() -> list[Any]:
            wait_ms = 0
            if blocking:
                left = deadline - time.monotonic()
                wait_ms = FOREVER_MS if left == math.inf else max(1, int(left * 1000))
            return call(
                "acquire",
                self.key,
                script,
                keys=self.keys.script_keys,
                args=[token, ttl_ms, wait_ms, self.keys.wake, GRACE_MS],
                client=self.client,
            )

        reply = ask()
        while True:
            if int(reply[0]) == 1:
                return self._granted(token, int(reply[1]))
            self.holder = decode(reply[2])
            self.holder_ttl_ms = int(reply[1])
            if not blocking:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return self._give_up(token)
            # Block until a release hands us the lock, or the holder's lease
            # would have run out (it may have crashed): then ask again,
            # keeping our place in line.
            block = min(left, max(self.holder_ttl_ms, 1) / 1000.0 + 0.002)
            if cap is not None:
                block = min(block, cap)
            popped = call("acquire", self.key, self.client.blpop, [wake_key], timeout=block)
            if popped is not None:
                return self._granted(token, int(popped[1]))
            reply = ask()

    def _give_up(self, token: str) -> bool:
        reply = call(
            "acquire",
            self.key,
            scripts.get("lock_cancel"),
            keys=self.keys.script_keys,
            args=[token, self.keys.wake],
            client=self.client,
        )
        if int(reply[0]) == 1:  # a release granted it to us just in time
            return self._granted(token, int(reply[1]))
        return False

    def _granted(self, token: str, fence: int) -> bool:
        self._token = token
        self.fence = fence
        self.lost = False
        self.holder = self.holder_ttl_ms = None
        if self.renew:
            renewal.keeper().add(self)
        return True

    # -- release / extend --------------------------------------------------

    def release(self) -> None:
        """Release the lock and hand it to the next waiter (one round trip).

        Raises LockNotOwned when this object does not hold the lock, and
        LockLost when it did but its lease ran out (someone else may hold it
        now; it is left untouched).
        """
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot release lock {self.name!r}: not acquired", self.key)
        renewal.keeper().discard(self)
        self._token = None
        fence, self.fence = self.fence, None
        released = call(
            "release",
            self.key,
            scripts.get("lock_release"),
            keys=self.keys.script_keys,
            args=[token, self.keys.wake, 0],
            client=self.client,
        )
        if not int(released):
            self.lost = True
            raise LockLost(
                f"lock {self.name!r} (fence {fence}) had expired before release; "
                "another owner may have held it",
                self.key,
            )

    def extend(self, ttl: Optional[float] = None) -> None:
        """Reset the lease to ``ttl`` seconds (default: the lock's ttl) from now."""
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot extend lock {self.name!r}: not acquired", self.key)
        seconds = self.ttl if ttl is None else _common.check_seconds(ttl, "extend ttl")
        ok = call(
            "extend",
            self.key,
            scripts.get("lock_extend"),
            keys=[self.key],
            args=[token, to_ms(seconds or self.ttl)],
            client=self.client,
        )
        if not int(ok):
            self._mark_lost("extend found the lease gone")
            self._token = None
            renewal.keeper().discard(self)
            raise LockLost(f"cannot extend lock {self.name!r}: its lease had expired", self.key)

    # -- inspection ----------------------------------------------------------

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        return bool(call("locked", self.key, self.client.exists, self.key))

    def owned(self) -> bool:
        """Whether this object holds the lock now, as Redis sees it (one round trip)."""
        if self._token is None:
            return False
        value = call("owned", self.key, self.client.get, self.key)
        return value is not None and decode(value) == self._token

    # -- context manager -----------------------------------------------------

    def __enter__(self) -> Lock:
        if not self.acquire(timeout=self.timeout):
            raise LockTimeout(
                f"could not acquire lock {self.name!r} within {self.timeout} s; "
                f"held by {self.holder!r} for another {self.holder_ttl_ms} ms",
                self.key,
                self.holder,
                self.holder_ttl_ms,
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    # -- renewal hooks (see renewal.Renewable) ---------------------------------

    def _renew_call(self) -> tuple[Any, list[str], list[Any]]:
        return scripts.get("lock_extend"), [self.key], [self._token, to_ms(self.ttl)]

    def _mark_lost(self, reason: str) -> None:
        self.lost = True
        if self.on_lost is not None:
            try:
                self.on_lost(self, reason)
            except Exception:
                renewal.logger.exception("on_lost callback of %r failed", self)
        renewal.notify_lost(self, reason)


def reap(client: Any, name: str, owner: str, *, prefix: str = "redislock") -> bool:
    """Release lock ``name`` if its owner token starts with ``owner``.

    For a supervisor (a worker's main process) whose child died holding the
    lock; ``owner`` must identify that child's holds only.  One round trip.
    """
    k = keys.lock_keys(prefix, name)
    released = call(
        "reap",
        k.lock,
        scripts.get("lock_release"),
        keys=k.script_keys,
        args=[owner, k.wake, 1],
        client=client,
    )
    return bool(int(released))
