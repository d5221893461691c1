"""Redis locks, semaphores and contention policies around Celery task execution."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .exceptions import (
    BackendUnavailable,
    ConfigurationError,
    LockContended,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
    RedisLockError,
    TaskSkipped,
)
from .locks import Lock
from .rwlock import ReadWriteLock
from .semaphore import Semaphore
from .task import Hold, LockedTask

try:
    __version__ = version("celery-redislock")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "BackendUnavailable",
    "ConfigurationError",
    "Hold",
    "Lock",
    "LockContended",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "LockedTask",
    "ReadWriteLock",
    "RedisLockError",
    "Semaphore",
    "TaskSkipped",
    "__version__",
]
