"""The peers' timeout: a job's key lets go at a fixed time, even while it runs.

celery-once's ``timeout`` and celery-singleton's ``lock_expiry`` are the
life of the key from the publish on, whatever the job is doing then.  The
shims carry that deadline in the message (:data:`HEADER`, epoch seconds);
a run still going at its deadline lets its job's key go (only if its job
still holds it: a job that took the key since keeps it), and stops renewing
it.  One thread per process waits for every run's deadline.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Optional

__all__ = ["HEADER", "Deadlines", "deadlines"]

logger = logging.getLogger("celery_redislock")

#: Message header: when the job's key lets go, in epoch seconds.
HEADER = "redislock_compat_deadline"


class Deadlines:
    """Call functions at given times, on one daemon thread, until cancelled."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], Optional[float]]]] = []
        self._cancelled: set[int] = set()
        self._ids = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def at(self, when: float, fire: Callable[[], Optional[float]]) -> int:
        """Call ``fire()`` at epoch ``when``; it may return seconds after which
        to be called again.  Returns a handle for :meth:`cancel`."""
        handle = next(self._ids)
        with self._cond:
            heapq.heappush(self._heap, (when, handle, fire))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="redislock-compat-deadlines", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return handle

    def cancel(self, handle: int) -> None:
        """Forget ``handle`` (a function being called now decides for itself:
        it returns None once its run has ended)."""
        with self._cond:
            if any(h == handle for _, h, _ in self._heap):
                self._cancelled.add(handle)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.time():
                    wait = self._heap[0][0] - time.time() if self._heap else None
                    self._cond.wait(wait)
                _, handle, fire = heapq.heappop(self._heap)
                if handle in self._cancelled:
                    self._cancelled.discard(handle)
                    continue
            try:
                again = fire()
            except Exception:  # (a deadline is best effort: the key still lapses)
                logger.exception("deadline of a unique key failed")
                again = None
            if again is not None:
                with self._cond:
                    heapq.heappush(self._heap, (time.time() + again, handle, fire))


_deadlines: Optional[Deadlines] = None
_lock = threading.Lock()


def deadlines() -> Deadlines:
    """This process's :class:`Deadlines` (a new one after fork)."""
    global _deadlines
    if _deadlines is None:
        with _lock:
            if _deadlines is None:
                _deadlines = Deadlines()
    return _deadlines


def _after_fork_in_child() -> None:
    global _deadlines
    _deadlines = None


os.register_at_fork(after_in_child=_after_fork_in_child)
