"""Shims for celery-once and celery-singleton users: one changed import.

- ``once.py``: ``QueueOnce`` and its ``AlreadyQueued`` (celery-once);
- ``singleton.py``: ``Singleton``, ``DuplicateTaskError`` and ``clear_locks``
  (celery-singleton);
- ``base.py``: what both share, a LockedTask whose options come from the
  peer's, and the lock store following the peer's setting;
- ``deadline.py``: the peers' timeout, which lets a key go even while its
  job runs.

Each shim is a :class:`~celery_redislock.LockedTask` with ``unique=`` and
the task options set from the peer's options, so its behaviour (and the
peers' bugs it does not have) is the library's own.  What it may import: the
public modules of ``celery_redislock.tasks``, ``celery_redislock.unique``,
``celery_redislock.primitives`` and ``celery_redislock.ops``; nothing
imports this package.
"""

from __future__ import annotations

from .once import AlreadyQueued, QueueOnce
from .singleton import DuplicateTaskError, Singleton, clear_locks

__all__ = ["AlreadyQueued", "DuplicateTaskError", "QueueOnce", "Singleton", "clear_locks"]
