"""The exception tree of celery_redislock.

::

    RedisLockError                   base of everything raised here
    ├── ConfigurationError           bad setting or option (also a ValueError)
    ├── BackendUnavailable           Redis could not be reached (chains the redis-py error)
    └── LockError                    something about one lock
        ├── LockContended            held by someone else (key, holder, ttl_ms)
        │   └── LockTimeout          gave up waiting for it
        └── LockNotOwned             release/extend of a lock the caller does not hold
            └── LockLost             the caller held it, but its lease ran out

Every ``LockError`` carries the Redis ``key`` it is about; contention errors also
carry the ``holder`` (owner token, or the holder's task id for tasks) and the
holder's remaining lease in milliseconds (``ttl_ms``).
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "BackendUnavailable",
    "ConfigurationError",
    "LockContended",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "RedisLockError",
]


class RedisLockError(Exception):
    """Base class of every error raised by celery_redislock."""


class ConfigurationError(RedisLockError, ValueError):
    """A setting or task option has a bad value; the message names it and the value."""


class BackendUnavailable(RedisLockError):
    """Redis could not be reached; ``__cause__`` holds the redis-py error."""


class LockError(RedisLockError):
    """An operation on one lock failed."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Exceptions cross process boundaries (result backends pickle or
        # JSON them), so keep the constructor arguments reconstructible.
        return (self.__class__, (self.args[0], self.key))


class LockContended(LockError):
    """The lock is held by someone else."""

    def __init__(
        self,
        message: str = "",
        key: str = "",
        holder: Optional[str] = None,
        ttl_ms: Optional[int] = None,
    ) -> None:
        if not message:
            message = f"lock {key!r} is held by {holder!r} for another {ttl_ms} ms"
        super().__init__(message, key)
        self.holder = holder
        self.ttl_ms = ttl_ms

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (self.__class__, (self.args[0], self.key, self.holder, self.ttl_ms))


class LockTimeout(LockContended):
    """Waiting for the lock took longer than the caller's timeout."""


class LockNotOwned(LockError):
    """The caller tried to release or extend a lock it does not hold."""


class LockLost(LockNotOwned):
    """The caller held the lock, but its lease expired before release or renewal."""
