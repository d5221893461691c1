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

import inspect
import logging
import time
from collections.abc import Sequence
from typing import Any, Optional

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from . import _common, config, contention, fold, guards, park, signals, wire
from .exceptions import BackendUnavailable, ConfigurationError, LockError
from .policy import effective_policy, owner_prefix
from .primitive import Primitive
from .taskkey import KeySpec

__all__ = ["Hold", "LockedTask"]

logger = logging.getLogger("celery_redislock")

#: Outcomes the tracer does not call after_return for (RETRY, IGNORED, REJECTED).
_NO_AFTER_RETURN = (Retry, Ignore, Reject)

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
    """One task run's hold: ``fence``, ``name``, ``key`` and the primitive ``lock``.

    Available to the body as ``self.request.redislock``; ``release()`` is
    idempotent, so every exit path can call it and it happens exactly once.
    """

    def __init__(self, task: Any, request: Any, lock: Primitive) -> None:
        self.task = task
        self.request = request
        self.lock = lock
        self.name = lock.name
        self.key = lock.key
        self.fence = lock.fence
        self.released = False

    def release(self, *, soon: bool = False) -> None:
        """Release the hold (once; later calls do nothing).

        ``soon``: send the release without waiting for Redis's reply, which
        :func:`celery_redislock.wire.settle` (or this thread's next call to
        Redis) reads; the ``lock_released`` or ``lock_lost`` signal is sent then.
        """
        if self.released:
            return
        self.released = True
        if soon:
            self.lock.release_soon(self._outcome)
            return
        try:
            self.lock.release()
        except (LockError, BackendUnavailable) as exc:
            self._outcome(exc)
        else:
            self._outcome(None)

    def release_packed(self) -> Optional[tuple[bytes, Any]]:
        """Begin the release for a caller that sends it in its own batch (see
        :meth:`Primitive.release_packed`); None when already released."""
        if self.released:
            return None
        self.released = True
        return self.lock.release_packed(self._outcome)

    def _outcome(self, exc: Optional[Exception]) -> None:
        if isinstance(exc, LockError):
            # The body has already run; changing its outcome now would run
            # errbacks after its side effects.  Report loudly instead.
            logger.error("%s[%s]: %s", self.task.name, self.request.id, exc)
            signals.lock_lost.send(sender=self.task, key=self.key, reason=str(exc), lock=self.lock)
        elif isinstance(exc, BackendUnavailable):
            logger.error(
                "%s[%s]: could not release %s, it frees when its lease ends: %s",
                self.task.name,
                self.request.id,
                self.key,
                exc,
            )
        elif exc is not None:
            logger.error(
                "%s[%s]: releasing %s failed: %r", self.task.name, self.request.id, self.key, exc
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
    ``semaphore``: at most N runs at once (per key with ``lock_key``).
    ``concurrency_group``: join a named limit from ``redislock_semaphores``.
    ``lock_mode``: ``"read"`` or ``"write"`` side of a ReadWriteLock.
    ``lock_ttl``, ``lock_renew_interval``, ``on_contention``
    (retry/skip/wait/fail/park), ``lock_retry_backoff``,
    ``lock_retry_backoff_max``, ``lock_retry_max``, ``lock_wait_timeout``,
    ``lock_wait_fallback``, ``lock_on_redis_error``.
    """

    Request = "celery_redislock.request:LockedRequest"

    lock_key: Any = None
    lock_name: Optional[str] = None
    semaphore: Optional[int] = None
    concurrency_group: Optional[str] = None
    lock_mode: Optional[str] = None
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
    #: Whether the next __call__ after LockedTask's in the MRO is Task's own.
    _redislock_direct = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery builds a class per decorated function (type(name, (base,),
        # options)) when the app finalizes or the task is first used, so this
        # runs before any run: bad options fail at definition, not mid-flight.
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        after = cls.__mro__[cls.__mro__.index(LockedTask) + 1 :]
        cls._redislock_direct = next(k for k in after if "__call__" in k.__dict__) is Task
        for option, field in OPTIONS.items():
            value = cls.__dict__.get(option)
            if value is not None:
                config.validate(field, value, f"task {name!r}: option {option}")
        lock_name = cls.__dict__.get("lock_name")
        if lock_name is not None and (not isinstance(lock_name, str) or not lock_name):
            raise ConfigurationError(
                f"task {name!r}: option lock_name must be a non-empty str, got {lock_name!r}"
            )
        app = cls.__dict__.get("app")
        # Check the group against an app that configures groups.  Celery copies
        # shared tasks into every app created later; an app without any
        # redislock_semaphores is left to fail at the first run instead.
        groups = (
            config.settings_for(app).semaphores
            if (app is not None and cls.concurrency_group is not None)
            else None
        ) or None
        guards.check_options(name, cls.semaphore, cls.concurrency_group, cls.lock_mode, groups)
        if "run" in cls.__dict__ or "lock_key" in cls.__dict__:
            # Celery stores run as a staticmethod unless bind=True; a plain
            # function (bind=True, or a class-based task) takes the task first.
            raw = inspect.getattr_static(cls, "run")
            bound = not isinstance(raw, staticmethod)
            cls._redislock_keyspec = KeySpec(name, cls.run, cls.lock_key, bound=bound)

    # -- options and names ---------------------------------------------------

    def lock_option(self, option: str) -> Any:
        """The effective value of ``option``: task attribute, else app.conf, else default."""
        value = getattr(self, option)
        if value is None:
            value = getattr(config.settings_for(self.app), OPTIONS[option])
        return value

    def lock_key_for(self, args: Sequence[Any], kwargs: Optional[dict[str, Any]]) -> str:
        """The per-call part of the lock name ("" when there is one lock per task)."""
        spec = self._redislock_keyspec
        if spec is None:
            spec = type(self)._redislock_keyspec = KeySpec(self.name, self.run, self.lock_key)
        return spec.key(args or (), kwargs or {})

    def lock_name_for(self, args: Sequence[Any], kwargs: Optional[dict[str, Any]]) -> str:
        """The name of the lock (or semaphore) one call with these arguments uses."""
        return guards.target(self, args, kwargs)[0]

    def lock_target_for(
        self, args: Sequence[Any], kwargs: Optional[dict[str, Any]]
    ) -> tuple[str, Optional[str]]:
        """(name, kind) of the primitive guarding a call; kind None, "sem" or "rw"."""
        return guards.target(self, args, kwargs)

    # -- publishing ------------------------------------------------------------

    def apply_async(self, *args: Any, **options: Any) -> Any:
        if self.lock_option("on_contention") == "park":
            # A parked run's place in line is its publish time (the order it
            # was submitted in), not the order worker processes reach Redis.
            headers = dict(options.get("headers") or {})
            headers.setdefault(park.SENT_HEADER, round(time.time() * 1000, 3))
            options["headers"] = headers
        return super().apply_async(*args, **options)

    # -- lifecycle ------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        if request is None or request.called_directly:
            # A direct call task(...) is a plain function call in the caller's
            # process: no message, no worker, and no lock.
            return super().__call__(*args, **kwargs)
        hold = self._redislock_enter(request, args, kwargs)
        if hold is None:  # Redis unreachable and lock_on_redis_error="run"
            return self._redislock_body(args, kwargs)
        try:
            result = self._redislock_body(args, kwargs)
        except Exception as exc:
            # FAILURE gets after_return; RETRY, IGNORED and REJECTED do not
            # (celery/app/trace.py), so their release is waited for here.
            hold.release(soon=not isinstance(exc, _NO_AFTER_RETURN))
            raise
        except BaseException:
            hold.release()  # the tracer lets these through: no after_return
            raise
        finally:
            # The hold keeps the request (for its signals); the request need
            # not keep the hold once the body is over, and a cycle between them
            # would leave both to the garbage collector.
            request.redislock = None
        if not fold.offer(self, request, hold):
            # Sent now, read once the result is stored (after_return): the lock
            # is free at once, and this process does not wait for Redis to say so.
            hold.release(soon=True)
        return result

    def _redislock_body(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        if self._redislock_direct:
            # Task.__call__ would push a copy of the request the tracer has
            # just pushed (and the task, again); the tracer calls run()
            # directly for tasks that do not override __call__, and so do we.
            return self.run(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        # The tracer calls this after storing a SUCCESS or FAILURE result; the
        # release's reply has arrived by now.  Subclasses overriding
        # after_return call super(), or the reply waits for this thread's next
        # call to Redis (the lock itself is released either way).
        fold.flush()  # a release left to a result store that did not happen
        wire.settle()  # this thread's deferred replies, whichever client
        super().after_return(status, retval, task_id, args, kwargs, einfo)

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

    def _redislock_primitive(self, name: str, kind: Optional[str], owner: str) -> Primitive:
        settings = config.settings_for(self.app)
        prim = guards.build(
            self,
            name,
            kind,
            config.client_for(self.app),
            settings.semaphores,
            ttl=self.lock_option("lock_ttl"),
            prefix=settings.key_prefix,
            renew_interval=self.lock_option("lock_renew_interval"),
            owner=owner,
            park_reserve=settings.park_reserve,
        )
        prim.task = self  # type: ignore[attr-defined]  # for lock_lost receivers
        prim.on_parked = park.publisher(self.app, prim, kind)
        return prim

    def _redislock_enter(
        self, request: Any, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Optional[Hold]:
        signals.connect()
        name, kind = self.lock_target_for(args, kwargs)
        prim = self._redislock_primitive(
            name, kind, owner_prefix(request.id, request.hostname, _common.process.pid)
        )
        policy = effective_policy(self.lock_option("on_contention"), bool(request.is_eager))
        try:
            if policy == "park":
                acquired = self._redislock_park(request, prim, kind)
            elif policy == "wait":
                acquired = prim.acquire(timeout=self.lock_option("lock_wait_timeout"))
            else:
                acquired = prim.acquire(blocking=False)
        except BackendUnavailable as exc:
            self._redislock_unreachable(request, name, exc)
            return None
        if not acquired:
            contention.contended(self, request, prim, policy)
        hold = Hold(self, request, prim)
        request.redislock = hold
        request.lock_fence = prim.fence
        signals.lock_acquired.send(
            sender=self, request=request, key=prim.key, name=name, fence=prim.fence
        )
        return hold

    def _redislock_park(self, request: Any, prim: Primitive, kind: Optional[str]) -> bool:
        headers = dict(request.headers or {})
        token = headers.get(park.PARK_HEADER)
        claim = token is not None
        if token is None:
            token = _common.new_token(owner_prefix(request.id, "park", 0))
            headers[park.PARK_HEADER] = token
        sig = self.signature_from_request(request, headers=headers)
        payload = park.encode(sig, self.serializer or self.app.conf.task_serializer)
        order = headers.get(park.SENT_HEADER)
        status = prim.acquire_or_park(
            token, payload, claim=claim, order_ms=float(order) if order else None
        )
        park.ensure_sweeper(self.app)
        if status == "held":
            return True
        if status == "duplicate":
            logger.warning(
                "%s[%s]: a second delivery of a parked run that already ran; dropped",
                self.name,
                request.id,
            )
            raise Ignore("duplicate delivery of a parked run")
        contention.parked(self, request, prim, kind)
        return False  # pragma: no cover

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
            contention.retry_later(self, request, exc)
        raise exc
