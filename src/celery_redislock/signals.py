"""The library's own Celery signals, and the explicit hookup of its handlers.

Each signal is sent with ``sender`` = the task (or None for a bare primitive)
and these keyword arguments:

- ``lock_acquired(request, key, name, fence, waited)``: a task run took its
  lock; ``waited`` is how long it waited for it, in seconds: a re-published
  parked run since its publish (the time that placed it in line), any other
  run from its first attempt to the grant (the blocking of ``wait``).
- ``lock_contended(request, key, name, holder, ttl_ms, policy)``: the lock was
  held; ``holder`` is the holder's task id, ``policy`` what happens next.
- ``lock_released(request, key, name, fence, held)``: a task run released its
  lock; ``held`` is how long it held it, in seconds (grant to release sent).
- ``task_skipped(request, key, name, holder)``: a run was dropped by ``skip``.
- ``lock_lost(key, reason, lock)``: renewal found a held lease gone, or a
  task run's release did (one lease may be reported by both).
- ``task_duplicate(key, task_id, existing_id, action)``: a publish met a job
  holding its unique key, in the publishing process.  ``task_id`` is the
  publish's, ``existing_id`` the other job's; ``action`` what was done:
  ``"return"`` (nothing sent, the existing job's result returned),
  ``"raise"`` (AlreadyQueued raised), ``"replace"`` (sent; the existing
  waiting job is dropped as it reaches a worker) or ``"fail"`` (inside a
  canvas: sent, to end at once as a FAILURE with AlreadyQueued, so that the
  rest of the canvas learns of it).
- ``rate_limited(request, key, name, delay, policy)``: a run found no start
  free under its rate limit; ``delay`` is the seconds to the slot it holds
  (``defer``, ``wait``) or to the next free one (``skip``, ``fail``), and
  ``policy`` its ``on_rate_limited``.
- ``task_republished(task_id, task_name)``: a parked run granted its lock was
  re-published, by the process whose script call granted it (the holder's
  release, or a park sweeper); ``sender`` is the task when this process has
  it registered, else None.
- ``parked_lost(reason, republished, lost)``: a park sweeper found that the
  lock store lost its data (``reason``); ``sender`` is the app.  Of the runs
  this process had parked there, ``republished`` were re-published (they had
  not started), and ``lost`` lists the task ids whose state it could not
  learn: they may never run.  Alert on a non-empty ``lost``.

``waited`` and ``held`` cost a clock read each, taken only while the signal
has receivers; ``task_republished`` is sent only then (a hot path sends
nothing nobody hears).
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
    "parked_lost",
    "rate_limited",
    "task_duplicate",
    "task_republished",
    "task_skipped",
]

lock_acquired = Signal(name="lock_acquired")
lock_contended = Signal(name="lock_contended")
lock_released = Signal(name="lock_released")
task_skipped = Signal(name="task_skipped")
lock_lost = Signal(name="lock_lost")
task_duplicate = Signal(name="task_duplicate")
task_republished = Signal(name="task_republished")
parked_lost = Signal(name="parked_lost")
rate_limited = Signal(name="rate_limited")


def _on_lease_lost(lease: Any, reason: str) -> None:
    lock_lost.send(sender=getattr(lease, "task", None), key=lease.key, reason=reason, lock=lease)


_connected = False


def connect() -> None:
    """Hook the renewal keeper's lost-lease reports to ``lock_lost`` (idempotent)."""
    global _connected
    if not _connected:
        add_lost_listener(_on_lease_lost)
        _connected = True
