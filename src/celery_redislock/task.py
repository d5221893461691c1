"""LockedTask: take a Redis lock before a Celery task body runs, release it after.

The lock is taken in ``__call__``, which the tracer (celery/app/trace.py)
calls inside its try block in place of ``run`` for tasks that override it.
A ``try/finally`` around the body then releases exactly once on every
outcome the child sees: success, exception, ``Retry``, ``Ignore``,
``Reject`` and ``SoftTimeLimitExceeded`` (the tracer does not call
``after_return`` for RETRY, IGNORED or REJECTED, and ``before_start`` would
leave the release to a second hook).  Deaths the child cannot see (hard time
limit, ``revoke(terminate=True)``) are handled by the worker's main process
in :mod:`celery_redislock.request`.

Per-run state lives on the request (``self.request.redislock``), never on
the task instance, which one worker process shares among its threads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, Optional

from celery import Task
from celery.exceptions import Ignore, Retry

from . import config, signals
from .exceptions import (
    BackendUnavailable,
    ConfigurationError,
    LockContended,
    LockError,
    TaskSkipped,
)
from .locks import Lock
from .policy import RETRIES_HEADER, backoff, effective_policy, holder_task_id, owner_prefix
from .taskkey import KeySpec

__all__ = ["Hold", "LockedTask"]

logger = logging.getLogger("celery_redislock")

#: Task option -> Settings field supplying its default.
OPTIONS = {
    "lock_ttl": "lock_ttl",
    "lock_renew_interval": "renew_interval",
    "on_contention": "on_contention",
    "lock_retry_backoff": "lock_retry_backoff",
    "lock_retry_backoff_max": "lock_retry_backoff_max",
    "lock_retry_max": "lock_retry_max",
    "lock_wait_timeout": "lock_wait_timeout",
    "lock_wait_fallback": "lock_wait_fallback",
    "lock_on_redis_error": "on_redis_error",
}


class Hold:
    """One task run's hold of its lock: ``fence``, ``name``, ``key``, ``lock``.

    Available to the body as ``self.request.redislock``; ``release()`` is
    idempotent, so every exit path can call it and it happens exactly once.
    """

    def __init__(self, task: Any, request: Any, lock: Lock) -> None:
        self.task = task
        self.request = request
        self.lock = lock
        self.name = lock.name
        self.key = lock.key
        self.fence = lock.fence
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        try:
            self.lock.release()
        except LockError as exc:
            # The body has already run; changing its outcome now would run
            # errbacks after its side effects.  Report loudly instead.
            logger.error("%s[%s]: %s", self.task.name, self.request.id, exc)
            signals.lock_lost.send(sender=self.task, key=self.key, reason=str(exc), lock=self.lock)
        except BackendUnavailable as exc:
            logger.error(
                "%s[%s]: could not release %s, it frees when its lease ends: %s",
                self.task.name,
                self.request.id,
                self.key,
                exc,
            )
        else:
            signals.lock_released.send(
                sender=self.task,
                request=self.request,
                key=self.key,
                name=self.name,
                fence=self.fence,
            )


class LockedTask(Task):  # type: ignore[misc]
    """A Celery task that runs its body only while holding a Redis lock.

    Options (decorator keyword arguments; each defaults to ``redislock_<option>``
    in app.conf, see :class:`celery_redislock.config.Settings`):

    ``lock_key``: None (one lock per task), parameter names, a template such as
    ``"user:{user_id}"``, or a callable of the task's arguments.
    ``lock_name``: replaces the task name as the lock's namespace; tasks with
    the same ``lock_name`` (and key) share one lock.
    ``lock_ttl``, ``lock_renew_interval``, ``on_contention``
    (retry/skip/wait/fail), ``lock_retry_backoff``, ``lock_retry_backoff_max``,
    ``lock_retry_max``, ``lock_wait_timeout``, ``lock_wait_fallback``,
    ``lock_on_redis_error``.
    """

    Request = "celery_redislock.request:LockedRequest"

    lock_key: Any = None
    lock_name: Optional[str] = None
    lock_ttl: Optional[float] = None
    lock_renew_interval: Optional[float] = None
    on_contention: Optional[str] = None
    lock_retry_backoff: Optional[float] = None
    lock_retry_backoff_max: Optional[float] = None
    lock_retry_max: Optional[int] = None
    lock_wait_timeout: Optional[float] = None
    lock_wait_fallback: Optional[str] = None
    lock_on_redis_error: Optional[str] = None

    _redislock_keyspec: Optional[KeySpec] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery builds a class per decorated function (type(name, (base,),
        # options)), so this runs when the task is created: bad options fail
        # then, not on the first run.
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        for option, field in OPTIONS.items():
            value = cls.__dict__.get(option)
            if value is not None:
                config.validate(field, value, f"task {name!r}: option {option}")
        lock_name = cls.__dict__.get("lock_name")
        if lock_name is not None and (not isinstance(lock_name, str) or not lock_name):
            raise ConfigurationError(
                f"task {name!r}: option lock_name must be a non-empty str, got {lock_name!r}"
            )
        if "run" in cls.__dict__ or "lock_key" in cls.__dict__:
            cls._redislock_keyspec = KeySpec(name, cls.run, cls.lock_key)

    # -- options ------------------------------------------------------------

    def lock_option(self, option: str) -> Any:
        """The effective value of ``option``: task attribute, else app.conf, else default."""
        value = getattr(self, option)
        if value is None:
            value = getattr(config.settings_for(self.app), OPTIONS[option])
        return value

    def lock_name_for(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        """The lock name one call with these arguments uses."""
        spec = self._redislock_keyspec
        if spec is None:
            spec = type(self)._redislock_keyspec = KeySpec(self.name, self.run, self.lock_key)
        part = spec.key(args, kwargs or {})
        base = self.lock_name or self.name
        return f"{base}:{part}" if part else base

    # -- lifecycle ------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        if request is None or request.called_directly:
            # A direct call task(...) is a plain function call in the caller's
            # process: no message, no worker, and no lock.
            return super().__call__(*args, **kwargs)
        hold = self._redislock_enter(request, args, kwargs)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            if hold is not None:
                hold.release()

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        # Task.retry publishes the new message before raising; release first,
        # or the retried run would find its own lock still held.
        self._redislock_release_early()
        return super().retry(*args, **kwargs)

    def replace(self, sig: Any) -> Any:
        # Same reason: the replacement may be this very task with these arguments.
        self._redislock_release_early()
        return super().replace(sig)

    def _redislock_release_early(self) -> None:
        hold = getattr(self.request, "redislock", None)
        if isinstance(hold, Hold):
            hold.release()

    def _redislock_enter(
        self, request: Any, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Optional[Hold]:
        signals.connect()
        settings = config.settings_for(self.app)
        name = self.lock_name_for(args, kwargs)
        lock = Lock(
            config.client_for(self.app),
            name,
            ttl=self.lock_option("lock_ttl"),
            prefix=settings.key_prefix,
            renew_interval=self.lock_option("lock_renew_interval"),
            owner=owner_prefix(request.id, request.hostname, os.getpid()),
        )
        lock.task = self  # type: ignore[attr-defined]  # for lock_lost receivers
        policy = effective_policy(self.lock_option("on_contention"), bool(request.is_eager))
        try:
            if policy == "wait":
                acquired = lock.acquire(timeout=self.lock_option("lock_wait_timeout"))
            else:
                acquired = lock.acquire(blocking=False)
        except BackendUnavailable as exc:
            self._redislock_unreachable(request, name, exc)
            return None
        if acquired:
            hold = Hold(self, request, lock)
            request.redislock = hold
            request.lock_fence = lock.fence
            signals.lock_acquired.send(
                sender=self, request=request, key=lock.key, name=name, fence=lock.fence
            )
            return hold
        self._redislock_contended(request, lock, policy)
        raise AssertionError("unreachable")  # pragma: no cover

    def _redislock_contended(self, request: Any, lock: Lock, policy: str) -> None:
        holder = holder_task_id(lock.holder)
        ttl_ms = lock.holder_ttl_ms
        if policy == "wait":
            policy = self.lock_option("lock_wait_fallback")
            if request.is_eager:
                policy = "fail"
        signals.lock_contended.send(
            sender=self,
            request=request,
            key=lock.key,
            name=lock.name,
            holder=holder,
            ttl_ms=ttl_ms,
            policy=policy,
        )
        if policy == "skip":
            self._redislock_skip(request, lock, holder, ttl_ms)
        if policy == "fail":
            raise LockContended(
                f"{self.name}[{request.id}]: lock {lock.name!r} is held by task {holder} "
                f"for another {ttl_ms} ms",
                lock.key,
                holder,
                ttl_ms,
            )
        self._redislock_retry(
            request,
            LockContended(
                f"lock {lock.name!r} is held by task {holder} for another {ttl_ms} ms",
                lock.key,
                holder,
                ttl_ms,
            ),
        )

    def _redislock_skip(
        self, request: Any, lock: Lock, holder: Optional[str], ttl_ms: Optional[int]
    ) -> None:
        exc = TaskSkipped(
            f"{self.name}[{request.id}] skipped: lock {lock.name!r} is held by task {holder}",
            lock.key,
            holder,
            ttl_ms,
        )
        logger.info("%s", exc)
        signals.task_skipped.send(
            sender=self, request=request, key=lock.key, name=lock.name, holder=holder
        )
        if request.is_eager:
            raise exc
        # FAILURE with TaskSkipped: get() raises promptly and names the holder.
        # No errbacks (a skip is not an error); chained tasks are marked too,
        # so nothing downstream waits forever.  Ignore then stops the tracer
        # from storing anything else or running callbacks.
        self.backend.mark_as_failure(
            request.id,
            exc,
            request=request,
            call_errbacks=False,
            store_result=not self._redislock_ignore_result(request),
        )
        raise Ignore(str(exc))

    def _redislock_ignore_result(self, request: Any) -> bool:
        value = getattr(request, "ignore_result", None)
        return bool(self.ignore_result if value is None else value)

    def _redislock_retry(self, request: Any, reason: Exception) -> None:
        headers = dict(request.headers or {})
        attempt = int(headers.get(RETRIES_HEADER) or getattr(request, RETRIES_HEADER, 0) or 0)
        limit = self.lock_option("lock_retry_max")
        if limit is not None and attempt >= limit:
            if isinstance(reason, LockContended):
                raise LockContended(
                    f"{self.name}[{request.id}]: gave up after {attempt} contention retries; "
                    f"{reason}",
                    reason.key,
                    reason.holder,
                    reason.ttl_ms,
                ) from reason
            raise reason
        delay = backoff(
            attempt,
            self.lock_option("lock_retry_backoff"),
            self.lock_option("lock_retry_backoff_max"),
        )
        headers[RETRIES_HEADER] = attempt + 1
        # Same task id, args, kwargs, routing, priority, links and chain;
        # Celery's own ``retries`` is left as it was.
        sig = self.signature_from_request(request, countdown=delay, headers=headers)
        sig.apply_async()  # if this fails, the run fails visibly with the error
        raise Retry(
            f"lock contended, retry {attempt + 1} in {delay:.2f}s", exc=reason, when=delay, sig=sig
        )

    def _redislock_unreachable(self, request: Any, name: str, exc: BackendUnavailable) -> None:
        policy = self.lock_option("lock_on_redis_error")
        logger.error(
            "%s[%s]: lock store unreachable for %r (%s): %s",
            self.name,
            request.id,
            name,
            policy,
            exc,
        )
        if policy == "run":
            return
        if policy == "retry" and not request.is_eager:
            self._redislock_retry(request, exc)
        raise exc
