"""Hold: one task run's hold on its lock, released exactly once.

A small state machine::

    held ──release()──────────────────────────┬──> released
      └───release_async()──> releasing ──settle()──┤
                                               └──> lost

A unique job's run also ends its claim on the job's key (:mod:`celery_redislock.unique.run`):
in the same script call as the lock where the lock can carry it.

``release()`` and ``settle()`` may be called from every exit path of a run,
any number of times: the first one that finds something to do does it, the
others find nothing left.  ``release_async()`` sends the release and leaves
its outcome (and the ``lock_released`` or ``lock_lost`` signal) to
``settle()``, which LockedTask calls once the result is stored.

The hold does not keep the run's request (the request keeps the hold, as
``request.redislock``); the request is passed in where a signal needs it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Optional

from .. import signals
from ..exceptions import BackendUnavailable, LockError
from ..primitives import Primitive, Release

if TYPE_CHECKING:
    from ..unique.run import UniqueRun

__all__ = ["Hold"]

logger = logging.getLogger("celery_redislock")


class Hold:
    """One task run's hold: ``fence``, ``name``, ``key``, the primitive ``lock``,
    ``state``, and the run's claim on its unique key (``unique``, or None)."""

    HELD = "held"
    RELEASING = "releasing"
    RELEASED = "released"
    LOST = "lost"

    __slots__ = ("_pending", "fence", "held", "key", "lock", "name", "state", "task", "unique")

    def __init__(self, task: Any, lock: Primitive, unique: Optional[UniqueRun] = None) -> None:
        self.task = task
        self.lock = lock
        self.unique = unique
        self.name = lock.name
        self.key = lock.key
        self.fence = lock.fence
        self.state = self.HELD
        self._pending: Optional[Release] = None
        #: Seconds held, when lock_released has receivers as the release is sent.
        self.held: Optional[float] = None

    def __repr__(self) -> str:
        return f"<Hold {self.key!r} fence={self.fence} {self.state}>"

    def release(self, request: Any, waits_again: bool = False) -> None:
        """Release now and wait for the outcome (a releasing hold is settled).

        ``waits_again``: the job goes back to wait (a retry, a requeue), so a
        unique job keeps its key."""
        if self.state == self.RELEASING:
            self.settle(request)
            return
        if self.state != self.HELD:
            return
        self.state = self.RELEASING
        if signals.lock_released.receivers:
            self.held = self._held_now()
        unique = self.unique
        if unique is not None and waits_again:
            unique.wait_again(self.lock)
        try:
            self.lock.release()
        except (LockError, BackendUnavailable) as exc:
            self._end(request, exc)
        else:
            self._end(request, None)
        finally:
            if unique is not None:
                unique.ended()

    def release_async(self, request: Any) -> None:
        """Send the release; :meth:`settle` learns how it went."""
        if self.state != self.HELD:
            return
        self.state = self.RELEASING
        if signals.lock_released.receivers:
            self.held = self._held_now()
        try:
            self._pending = self.lock.release_async()
        except BackendUnavailable as exc:
            self._end(request, exc)
        finally:
            if self.unique is not None:
                self.unique.ended()

    def settle(self, request: Any) -> None:
        """Learn how a release sent by :meth:`release_async` went (once)."""
        pending, self._pending = self._pending, None
        if pending is None or self.state != self.RELEASING:
            return
        try:
            pending.wait()
        except (LockError, BackendUnavailable) as exc:
            self._end(request, exc)
        else:
            self._end(request, None)

    def _end(self, request: Any, exc: Optional[Exception]) -> None:
        task_id = getattr(request, "id", None)
        if isinstance(exc, LockError):
            self.state = self.LOST
            # The body has already run; changing its outcome now would run
            # errbacks after its side effects.  Report loudly instead.
            logger.error("%s[%s]: %s", self.task.name, task_id, exc)
            signals.lock_lost.send(sender=self.task, key=self.key, reason=str(exc), lock=self.lock)
            return
        self.state = self.RELEASED
        if exc is not None:
            logger.error(
                "%s[%s]: could not release %s, it frees when its lease ends: %s",
                self.task.name,
                task_id,
                self.key,
                exc,
            )
            return
        if signals.lock_released.receivers:  # (else send() does nothing: skip its arguments)
            signals.lock_released.send(
                sender=self.task,
                request=request,
                key=self.key,
                name=self.name,
                fence=self.fence,
                held=self.held if self.held is not None else self._held_now(),
            )

    def _held_now(self) -> float:
        """Seconds since the grant."""
        return time.monotonic() - (self.lock.granted_at or 0.0)
