"""The exception tree of celery_redislock.

::

    RedisLockError                   base of everything raised here
    ├── ConfigurationError           bad setting or option (also a ValueError)
    ├── BackendUnavailable           Redis could not be reached (chains the redis-py error)
    ├── BackendUnsupported           the Redis server is older than the scripts need (6.2)
    └── LockError                    something about one lock
        ├── LockContended            held by someone else (key, holder, ttl_ms)
        │   ├── LockTimeout          gave up waiting for it
        │   ├── TaskSkipped          a task run dropped by on_contention="skip"
        │   └── RateLimited          no start free under a rate limit (key, delay)
        ├── LockNotOwned             release/extend of a lock the caller does not hold
        │   └── LockLost             the caller held it, but its lease ran out
        ├── AlreadyQueued            a publish refused: the same job is queued (key, task_id)
        └── TaskSuperseded           a queued run dropped: a newer publish replaced it

Every ``LockError`` carries the Redis ``key`` it is about; contention errors also
carry the ``holder`` (owner token, or the holder's task id for tasks) and the
holder's remaining lease in milliseconds (``ttl_ms``).  The unique-job errors
carry the ``task_id`` of the other job: the one holding the key, or the one
that superseded the run.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "AlreadyQueued",
    "BackendUnavailable",
    "BackendUnsupported",
    "ConfigurationError",
    "LockContended",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "RateLimited",
    "RedisLockError",
    "TaskSkipped",
    "TaskSuperseded",
]


class RedisLockError(Exception):
    """Base class of every error raised by celery_redislock."""


class ConfigurationError(RedisLockError, ValueError):
    """A setting or task option has a bad value; the message names it and the value."""


class BackendUnavailable(RedisLockError):
    """Redis could not be reached; ``__cause__`` holds the redis-py error."""


class BackendUnsupported(RedisLockError):
    """The Redis server refused a command the scripts run: they need Redis 6.2
    or later.  ``__cause__`` holds the server's error."""


class LockError(RedisLockError):
    """An operation on one lock failed."""

    def __init__(self, message: str, key: str = "") -> None:
        # All constructor arguments go in ``args``: result backends rebuild
        # exceptions as ``cls(*args)`` (JSON) or via __reduce__ (pickle).
        super().__init__(message, key)
        self.message = message
        self.key = key

    def __str__(self) -> str:
        return self.message


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
        self.args = (message, key, holder, ttl_ms)
        self.holder = holder
        self.ttl_ms = ttl_ms


class LockTimeout(LockContended):
    """Waiting for the lock took longer than the caller's timeout."""


class LockNotOwned(LockError):
    """The caller tried to release or extend a lock it does not hold."""


class LockLost(LockNotOwned):
    """The caller held the lock, but its lease expired before release or renewal."""


class TaskSkipped(LockContended):
    """A task run was dropped because its lock was held (``on_contention="skip"``).

    Stored as the run's FAILURE result, so ``AsyncResult.get()`` raises it
    promptly; ``holder`` is the task id of the run that held the lock.
    """


class RateLimited(LockContended):
    """No start is free under a rate limit now (``on_rate_limited="fail"``).

    ``delay`` is the seconds until the next free start, when this was raised;
    ``ttl_ms`` the same in milliseconds, as for any contention.
    """

    def __init__(self, message: str = "", key: str = "", delay: float = 0.0) -> None:
        if not message:
            message = f"rate limit {key!r}: the next start is free in {delay:.3f} s"
        super().__init__(message, key, None, max(0, round(delay * 1000)))
        self.args = (message, key, delay)
        self.delay = delay


class AlreadyQueued(LockError):
    """A publish refused because the same job is already queued (or running,
    under ``unique="until_finished"``).

    ``task_id`` is the job holding the unique ``key``; ``ttl_ms`` how much
    longer it holds the key at most (None when not known).
    """

    def __init__(
        self,
        message: str = "",
        key: str = "",
        task_id: Optional[str] = None,
        ttl_ms: Optional[int] = None,
    ) -> None:
        if not message:
            message = f"a job with unique key {key!r} is already queued: task {task_id}"
        super().__init__(message, key)
        self.args = (message, key, task_id, ttl_ms)
        self.task_id = task_id
        self.ttl_ms = ttl_ms


class TaskSuperseded(LockError):
    """A queued run dropped because a newer publish of the same job replaced it
    (``on_duplicate="replace"``, ``debounce``).

    Stored as the run's FAILURE result (no errbacks run, as for
    TaskSkipped); ``task_id`` is the job that replaced it.
    """

    def __init__(self, message: str = "", key: str = "", task_id: Optional[str] = None) -> None:
        if not message:
            message = f"superseded by task {task_id} (unique key {key!r})"
        super().__init__(message, key)
        self.args = (message, key, task_id)
        self.task_id = task_id
