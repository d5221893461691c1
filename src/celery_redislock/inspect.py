"""See what the library keeps in Redis, and clear what is stuck: the public inspect API.

The names live in :mod:`celery_redislock.ops.inspect`; see
:class:`Inspector`.  The ``celery redislock`` command and the web view are
built on it.
"""

from __future__ import annotations

from .ops.inspect import (
    Dropped,
    Entry,
    Holder,
    Inspector,
    Kind,
    ParkedRun,
    Released,
    Stats,
    UniqueJobs,
    Waiter,
)

__all__ = [
    "Dropped",
    "Entry",
    "Holder",
    "Inspector",
    "Kind",
    "ParkedRun",
    "Released",
    "Stats",
    "UniqueJobs",
    "Waiter",
]
