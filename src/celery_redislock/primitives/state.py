"""What a primitive is and holds, in either driver.

:class:`HoldState` keeps a primitive's checked arguments (see
:func:`.arguments.check`), its kind and keys, and the state of its current
hold: token, fence, when it was granted, whether it was lost, and what the
last failed acquire saw of the holder.  The sync primitives (``_core.py``
and the classes built on it) and the asyncio ones
(``celery_redislock.asyncio.primitive``) are built on it, and differ only in
how they send their calls and wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Optional

from ..exceptions import LockLost, LockTimeout
from . import arguments, keys, protocol
from .kinds import Kind, Mode
from .losses import logger, notify_lost
from .protocol import DEFAULT_RESERVE_MS, Handoff

__all__ = ["HoldState"]


class HoldState:
    """The arguments, keys and hold state of a Lock, a Semaphore or a side of
    a ReadWriteLock."""

    #: Which scripts and keys serve it.
    kind: ClassVar[Kind] = Kind.LOCK
    #: What messages call it: "lock", "semaphore", "read lock", "write lock".
    noun: str = "lock"
    #: How a hold is taken (None for a lock: there is one way).
    mode: Optional[Mode] = None
    #: How many may hold it at once, as sent to the scripts (0: not a semaphore).
    limit: int = 0

    #: Called with the parked entries a script call of this object granted
    #: (see tasks/parking.py); None: they are left to a recovery sweep.
    on_handoff: Optional[Callable[[list[Handoff]], Any]] = None
    #: How long a parked entry this object's calls grant may take to claim it.
    reserve_ms: int = DEFAULT_RESERVE_MS

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
        on_lost: Optional[Callable[[Any, str], None]] = None,
        fence_retention: float = arguments.DEFAULT_FENCE_RETENTION,
        wait_replicas: int = 0,
        wait_timeout_ms: int = arguments.DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        #: (replicas, timeout ms) every grant, renewal and release waits for
        #: (``WAIT``), or None.
        self.replicas: Optional[tuple[int, int]] = arguments.check(
            self.noun,
            name,
            ttl,
            timeout=timeout,
            renew_interval=renew_interval,
            prefix=prefix,
            fence_retention=fence_retention,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
        )
        self.client = client
        self.name = name
        self.ttl = float(ttl)
        self.timeout = None if timeout is None else float(timeout)
        self.renew_interval = float(renew_interval) if renew_interval is not None else ttl / 3
        self.renew = renew
        self.owner = owner
        self.on_lost = on_lost
        self.prefix = prefix
        self.fence_retention = float(fence_retention)
        #: The fence key outlives every lease (a retried acquire reads it back).
        self._keep_ms = protocol.to_ms(max(self.fence_retention, self.ttl))
        #: Fencing token of the current hold, or None when not held.
        self.fence: Optional[int] = None
        #: True once renewal (or release) found that the lease ran out while held.
        self.lost = False
        #: A holder's token and remaining lease (ms) seen by the last failed acquire.
        self.holder: Optional[str] = None
        self.holder_ttl_ms: Optional[int] = None
        #: Local monotonic time the current lease began, at the earliest.
        self.granted_at: Optional[float] = None
        self._token: Optional[str] = None
        #: Local send time and server time (ms) of the last queued attempt.
        self._sent = 0.0
        self._server_ms = 0
        #: Its Redis keys (all in one hash slot).
        self.keys = keys.of_kind(self.kind, self.prefix, self.name)

    @property
    def key(self) -> str:
        """The key that exists while the primitive is held (the lease lives there)."""
        return protocol.lead_key(self.keys)

    @property
    def token(self) -> Optional[str]:
        """The owner token of the current hold, or None."""
        return self._token

    def __repr__(self) -> str:
        state = f"held fence={self.fence}" if self._token else "not held"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    def _hold(self, token: str, fence: int, start: float) -> None:
        """Note the hold of ``token``; ``start`` is the local time the lease
        began at the earliest (renewal and the lost timer count from there)."""
        self._token = token
        self.fence = fence
        self.granted_at = start
        self.lost = False
        self.holder = self.holder_ttl_ms = None

    def _queued(self, result: protocol.Queued, sent: float) -> None:
        """Note who holds it, after a call ``sent`` at that local time queued us."""
        self.holder, self.holder_ttl_ms = result.holder, result.holder_ttl_ms
        self._sent, self._server_ms = sent, result.server_ms

    def _unhandled(self, handoffs: list[Handoff]) -> bool:
        """Whether granted parked runs have nobody to re-publish them (logged)."""
        if self.on_handoff is not None:
            return False
        logger.error(
            "%s %r granted %d parked task(s) but has no on_handoff to re-publish them; "
            "they are re-published when their reservation lapses",
            self.noun,
            self.name,
            len(handoffs),
        )
        return True

    def _timed_out(self) -> LockTimeout:
        """What ``with`` raises when it could not acquire within :attr:`timeout`."""
        return LockTimeout(
            f"could not acquire {self.noun} {self.name!r} within {self.timeout} s; "
            f"held by {self.holder!r} for another {self.holder_ttl_ms} ms",
            self.key,
            self.holder,
            self.holder_ttl_ms,
        )

    def _lost_before_release(self, fence: Optional[int]) -> LockLost:
        """A release found nothing to release: the lease had run out (noted)."""
        self.lost = True
        return LockLost(
            f"{self.noun} {self.name!r} (fence {fence}) had expired before release; "
            "another owner may have held it since",
            self.key,
        )

    def _mark_lost(self, reason: str) -> None:
        """The lease ran out while held: say so to the object, its ``on_lost``
        and every lost-lease listener."""
        self.lost = True
        if self.on_lost is not None:
            try:
                self.on_lost(self, reason)
            except Exception:
                logger.exception("on_lost callback of %r failed", self)
        notify_lost(self, reason)
