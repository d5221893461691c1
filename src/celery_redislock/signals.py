"""The library's own Celery signals, and the explicit hookup of its handlers.

Each signal is sent with ``sender`` = the task (or None for a bare primitive)
and these keyword arguments:

- ``lock_acquired(request, key, name, fence)``: a task run took its lock.
- ``lock_contended(request, key, name, holder, ttl_ms, policy)``: the lock was
  held; ``holder`` is the holder's task id, ``policy`` what happens next.
- ``lock_released(request, key, name, fence)``: a task run released its lock.
- ``task_skipped(request, key, name, holder)``: a run was dropped by ``skip``.
- ``lock_lost(key, reason, lock)``: renewal found a held lease gone.
- ``task_duplicate(key, task_id, existing_id, action)``: a publish met a job
  holding its unique key, in the publishing process.  ``task_id`` is the
  publish's, ``existing_id`` the other job's; ``action`` what was done:
  ``"return"`` (nothing sent, the existing job's result returned),
  ``"raise"`` (AlreadyQueued raised), ``"replace"`` (sent; the existing
  waiting job is dropped as it reaches a worker) or ``"fail"`` (inside a
  canvas: sent, to end at once as a FAILURE with AlreadyQueued, so that the
  rest of the canvas learns of it).
"""

from __future__ import annotations

from typing import Any

from celery.utils.dispatch import Signal

from .primitives import add_lost_listener

__all__ = [
    "connect",
    "lock_acquired",
    "lock_contended",
    "lock_lost",
    "lock_released",
    "task_duplicate",
    "task_skipped",
]

lock_acquired = Signal(name="lock_acquired")
lock_contended = Signal(name="lock_contended")
lock_released = Signal(name="lock_released")
task_skipped = Signal(name="task_skipped")
lock_lost = Signal(name="lock_lost")
task_duplicate = Signal(name="task_duplicate")


def _on_lease_lost(lease: Any, reason: str) -> None:
    lock_lost.send(sender=getattr(lease, "task", None), key=lease.key, reason=reason, lock=lease)


_connected = False


def connect() -> None:
    """Hook the renewal keeper's lost-lease reports to ``lock_lost`` (idempotent)."""
    global _connected
    if not _connected:
        add_lost_listener(_on_lease_lost)
        _connected = True
