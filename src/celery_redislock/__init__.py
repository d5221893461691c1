"""Redis locks, semaphores and contention policies around Celery task execution.

``Lock``, ``Semaphore``, ``ReadWriteLock`` and ``RateLimiter`` need only redis-py; importing
them does not import Celery.  ``LockedTask``, ``ConfiguredLocks``, ``PARKED`` (and the rest of
the Celery side, in :mod:`celery_redislock.tasks`) is imported on first use.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from .exceptions import (
    AlreadyQueued,
    BackendUnavailable,
    BackendUnsupported,
    ConfigurationError,
    LockContended,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
    RateLimited,
    RedisLockError,
    TaskSkipped,
    TaskSuperseded,
)
from .primitives import Lock, RateLimiter, ReadWriteLock, Semaphore

try:
    __version__ = version("celery-redislock")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "PARKED",
    "AlreadyQueued",
    "BackendUnavailable",
    "BackendUnsupported",
    "ConfigurationError",
    "ConfiguredLocks",
    "Hold",
    "Lock",
    "LockContended",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "LockedTask",
    "RateLimited",
    "RateLimiter",
    "ReadWriteLock",
    "RedisLockError",
    "Semaphore",
    "TaskSkipped",
    "TaskSuperseded",
    "__version__",
]

#: Names served lazily, from the Celery side.
_CELERY_SIDE = {
    "LockedTask": "locked_task",
    "Hold": "hold",
    "ConfiguredLocks": "configured",
    "PARKED": "parked_state",
}


def __getattr__(name: str) -> Any:
    module = _CELERY_SIDE.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_redislock' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".tasks.{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
