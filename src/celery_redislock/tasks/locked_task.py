"""LockedTask: take a Redis lock before a Celery task body runs, release it after.

The lock is taken in ``__call__``, which the tracer (celery/app/trace.py)
calls inside its try block in place of ``run`` for tasks that override it.
A ``try`` around the body then releases exactly once on every outcome the
child sees: success, exception, ``Retry``, ``Ignore``, ``Reject`` and
``SoftTimeLimitExceeded``.  Deaths the child cannot see (hard time limit,
``revoke(terminate=True)``) are handled by the worker's main process in
:mod:`celery_redislock.tasks.request`.

When the run ends with a result the tracer stores (SUCCESS or FAILURE), the
release is sent as the body ends and its outcome is read in ``after_return``,
after the result is stored: the lock is free at once, and the run does not
wait for Redis to say so.  The tracer calls no ``after_return`` for RETRY,
IGNORED and REJECTED, so those wait for their release.

A unique job (``unique=...``, :mod:`celery_redislock.unique`) is checked as
it is published (``apply_async``), and its run starts and ends its claim on
the job's key in the same script calls as the lock.

Per-run state lives on the request (``self.request.redislock``, the run's
:class:`~celery_redislock.tasks.hold.Hold`), never on the task instance,
which one worker process shares among its threads.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Sequence
from typing import Any, Optional

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from .. import config
from ..primitives import Kind, keys, unique
from ..unique import publish
from ..unique.policy import CALL_OPTIONS as UNIQUE_CALL_OPTIONS
from . import entry, parking, startup, targets
from .hold import Hold
from .lock_keys import KeySpec
from .messages import CALL_OPTIONS_HEADER, header, message_headers
from .options import OPTIONS, check_call_options, check_option_names
from .prepare import prepare

__all__ = ["LockedTask"]

logger = logging.getLogger("celery_redislock")

#: Outcomes the tracer does not call after_return for (RETRY, IGNORED, REJECTED).
_NO_AFTER_RETURN = (Retry, Ignore, Reject)
#: The requests whose traced call has begun, and the copies Celery pushes for
#: direct calls made under one of them.  A call that finds one of these on top
#: of its task's request stack is not the tracer's call for a run but a direct
#: call inside it: the body calling its own task, or Celery calling a
#: new-style errback of the same task in-process after the body failed
#: (celery/backends/base.py, _call_task_errbacks).  Kept out of the request
#: itself: Celery copies a request's attributes into the request it pushes for
#: a direct call (Task.push_request), and from there into headers a retry sends.
_CALLED: weakref.WeakSet[Any] = weakref.WeakSet()
#: What a run keeps on its request; never a header of a message.
_RUN_ATTRIBUTES = ("redislock", "lock_fence")


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
    ``lock_wait_fallback``, ``lock_on_redis_error``, ``lock_redis_error_retries``.

    Unique jobs (:mod:`celery_redislock.unique`): ``unique``
    (``"until_started"``, ``"until_finished"``, ``"coalesce"``), ``unique_key``
    (default: ``lock_key``), ``unique_ttl``, ``on_duplicate`` (``"return"``,
    ``"raise"``, ``"replace"``), ``debounce``, ``throttle``.
    """

    Request = "celery_redislock.tasks.request:LockedRequest"

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
    lock_redis_error_retries: Optional[int] = None
    unique: Optional[str] = None
    unique_key: Any = None
    unique_ttl: Optional[float] = None
    on_duplicate: Optional[str] = None
    debounce: Optional[float] = None
    throttle: Optional[float] = None
    global_rate_limit: Any = None
    rate_limit_key: Any = None
    rate_limit_group: Optional[str] = None
    on_rate_limited: Optional[str] = None

    #: Options of another library this class reads itself (``lock_expiry``,
    #: say): LockedTask's check of its own option names leaves them alone.
    foreign_options: tuple[str, ...] = ()

    _redislock_keyspec: Optional[KeySpec] = None
    _redislock_unique_keyspec: Optional[KeySpec] = None
    #: Whether the class sets unique, debounce or throttle (set by prepare()).
    _redislock_unique = False
    #: Whether the next __call__ after LockedTask's in the MRO is Task's own.
    _redislock_direct = True
    #: The parsed global_rate_limit, and the rate_limit_key (set by prepare()).
    _redislock_rate: Any = None
    _redislock_rate_keyspec: Optional[KeySpec] = None
    #: Whether runs take a start under a rate limit, and whether they take a
    #: lock (a rate limit alone takes none; set by prepare()).
    _redislock_rated = False
    _redislock_locks = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery builds a class per decorated function (type(name, (base,),
        # options)) when the app finalizes or the task is first used, so this
        # runs before any run: bad options fail at definition, not mid-flight.
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        check_option_names(cls, name)
        prepare(cls, name, LockedTask)

    @classmethod
    def bind(cls, app: Any) -> Any:
        # As the app finalizes: validate its settings (a bad one stops the
        # app here), and check the lock store when a worker starts.
        bound = super().bind(app)
        startup.install(app)
        return bound

    # -- options and names ---------------------------------------------------

    def lock_option(self, option: str, request: Any = None) -> Any:
        """The effective value of ``option`` for a run: the run's per-call option
        (``apply_async(redislock={...})``), else the task attribute, else
        app.conf, else the default."""
        overrides = None
        if request is not None:
            overrides = header(request, CALL_OPTIONS_HEADER)
        return self._redislock_option(option, overrides)

    def _redislock_option(
        self, option: str, overrides: Any, settings: Optional[config.Settings] = None
    ) -> Any:
        """:meth:`lock_option`, given the run's per-call options (and the app's
        settings) already looked up: a run reads several options."""
        if overrides and option in overrides:
            return overrides[option]
        value = getattr(self, option)
        if value is None:
            if settings is None:
                settings = config.settings_for(self.app)
            value = getattr(settings, OPTIONS[option])
        return value

    def lock_key_for(self, args: Sequence[Any], kwargs: Optional[dict[str, Any]]) -> str:
        """The per-call part of the lock name ("" when there is one lock per task)."""
        return self._keyspec().key(args or (), kwargs or {})

    def lock_name_for(self, args: Sequence[Any], kwargs: Optional[dict[str, Any]]) -> str:
        """The name of the lock (or semaphore) one call with these arguments uses."""
        return targets.target(self, args, kwargs)[0]

    def lock_target_for(
        self, args: Sequence[Any], kwargs: Optional[dict[str, Any]]
    ) -> tuple[str, Kind]:
        """(name, kind) of the primitive guarding a call (a lock, a semaphore
        or a read-write lock: a :class:`~celery_redislock.primitives.Kind`)."""
        return targets.target(self, args, kwargs)

    # -- unique jobs -------------------------------------------------------------

    def unique_key_for(self, args: Sequence[Any], kwargs: Optional[dict[str, Any]]) -> str:
        """The Redis key a call with these arguments holds as a unique job."""
        name = publish.key_name(self.name, self._unique_part(args, kwargs))
        return keys.unique_key(config.settings_for(self.app).key_prefix, name)

    def unique_holder(self, *args: Any, **kwargs: Any) -> Optional[str]:
        """The task id of the job holding the unique key of a call with these
        arguments (waiting, or running under ``until_finished``), or None."""
        key = self.unique_key_for(args, kwargs)
        return unique.state(config.client_for(self.app), key).holder

    def release_unique(self, *args: Any, **kwargs: Any) -> Optional[str]:
        """Free the unique key of a call with these arguments (and its throttle
        window), for operators; returns the task id that held it, or None.
        A job the key superseded is still dropped when it reaches a worker."""
        key = self.unique_key_for(args, kwargs)
        return unique.drop(config.client_for(self.app), key)

    # -- publishing ------------------------------------------------------------

    def apply_async(
        self,
        args: Optional[Sequence[Any]] = None,
        kwargs: Optional[dict[str, Any]] = None,
        **options: Any,
    ) -> Any:
        """Celery's ``apply_async``, plus ``redislock={"option": value, ...}``: options
        for this call only, which travel in the message: any of ``on_contention``,
        ``lock_ttl``, ``lock_renew_interval``, ``lock_retry_backoff``,
        ``lock_retry_backoff_max``, ``lock_retry_max``, ``lock_wait_timeout``,
        ``lock_wait_fallback``, ``lock_on_redis_error``, ``lock_redis_error_retries``,
        and the unique-job options
        ``unique``, ``unique_ttl``, ``on_duplicate``, ``debounce``, ``throttle``.

        A unique job whose key is held sends nothing: it returns the AsyncResult
        of the job holding the key (``on_duplicate="return"``) or raises
        AlreadyQueued (``"raise"``)."""
        per_call = options.pop("redislock", None)
        headers = dict(options.get("headers") or {})
        if per_call:
            per_call = headers[CALL_OPTIONS_HEADER] = check_call_options(self.name, per_call)
        policy = (per_call or {}).get("on_contention") or self.lock_option("on_contention")
        if policy == "park":
            # A parked run's place in line is its publish time (the order it
            # was submitted in), not the order worker processes reach Redis.
            headers.setdefault(parking.SENT_HEADER, round(time.time() * 1000, 3))
        if headers:
            options["headers"] = headers
        # A re-sent copy (a retry, a parked run) carries its per-call options
        # in its headers.
        per_call = per_call or headers.get(CALL_OPTIONS_HEADER)
        if self._redislock_unique or (per_call and any(o in per_call for o in UNIQUE_CALL_OPTIONS)):
            attributes = {o: getattr(self, o) for o in UNIQUE_CALL_OPTIONS}
            pol = publish.policy_for(self.app, self.name, attributes, per_call or {})
            if pol is not None:
                part = self._unique_part(args, kwargs)

                def send(opts: dict[str, Any]) -> Any:
                    return super(LockedTask, self).apply_async(args, kwargs, **opts)

                return publish.publish(
                    self.app, self, self.name, pol, part, options, send, self.AsyncResult
                )
        return super().apply_async(args, kwargs, **options)

    def _unique_part(self, args: Any, kwargs: Any) -> str:
        """The per-call part of the unique key ("" for one key per task)."""
        spec = self._redislock_unique_keyspec
        if spec is None:
            spec = type(self)._redislock_unique_keyspec = (
                KeySpec(self.name, self.run, self.unique_key, option="unique_key")
                if self.unique_key is not None
                else self._keyspec()
            )
        return spec.key(args or (), kwargs or {})

    def _keyspec(self) -> KeySpec:
        spec = self._redislock_keyspec
        if spec is None:
            spec = type(self)._redislock_keyspec = KeySpec(self.name, self.run, self.lock_key)
        return spec

    # -- lifecycle ------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        if request is None or request.called_directly or request in _CALLED:
            # A direct call task(...) is a plain function call in the caller's
            # process: no message, no worker, and no lock.  So is a call made
            # while a run of this task is under way in this thread: the run's
            # own lock covers it.
            return super().__call__(*args, **kwargs)
        _CALLED.add(request)
        hold = entry.enter(self, request, args, kwargs)
        if hold is None:  # Redis unreachable and lock_on_redis_error="run"
            return self._redislock_body(args, kwargs)
        try:
            result = self._redislock_body(args, kwargs)
        except Exception as exc:
            if isinstance(exc, _NO_AFTER_RETURN):
                # No after_return to settle it.  A rejected message put back
                # in the queue is the same job waiting again: it keeps its key.
                requeued = isinstance(exc, Reject) and bool(getattr(exc, "requeue", False))
                hold.release(request, waits_again=requeued)
            else:
                hold.release_async(request)  # FAILURE: settled in after_return
            raise
        except BaseException:
            hold.release(request)  # the tracer lets these through: no after_return
            raise
        hold.release_async(request)  # SUCCESS: settled in after_return
        return result

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        # Celery's Task.__call__ pushes a copy of the current request for a
        # direct call (recent Celery releases: id and called_directly=False
        # included).  Under a run's request the copy is a direct call's too,
        # and so is any call made under it; and what the run keeps on its
        # request must not become a header of the copy, which a retry or a
        # replace from inside the direct call would send.
        outer = self.request_stack.top
        super().push_request(*args, **kwargs)
        if outer is not None and outer in _CALLED:
            copy = self.request_stack.top
            _CALLED.add(copy)
            headers = getattr(copy, "headers", None)
            if isinstance(headers, dict) and any(a in headers for a in _RUN_ATTRIBUTES):
                copy.headers = {k: v for k, v in headers.items() if k not in _RUN_ATTRIBUTES}

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
        # release's reply has arrived by now.
        self._redislock_settle()
        super().after_return(status, retval, task_id, args, kwargs, einfo)

    def _redislock_settle(self) -> None:
        request = self.request
        hold = getattr(request, "redislock", None)
        if isinstance(hold, Hold):
            hold.settle(request)

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        # Task.retry publishes the new message before raising; release first,
        # or the retried run would find its own lock still held.  The retry
        # is the same job waiting again: a unique job keeps its key, and the
        # copy carries every header of ours (a Celery that keeps custom
        # headers only as request attributes would drop them).
        request = self.request
        hold = getattr(request, "redislock", None)
        if isinstance(hold, Hold):
            hold.release(request, waits_again=True)
        if not request.called_directly:
            kwargs["headers"] = {**message_headers(request), **(kwargs.get("headers") or {})}
        try:
            return super().retry(*args, **kwargs)
        except Retry:
            raise
        except BaseException:
            # No retry was sent (max_retries reached, or the send failed):
            # the job ends here, and its key with it.
            if isinstance(hold, Hold) and hold.unique is not None:
                hold.unique.drop()
            raise

    def replace(self, sig: Any) -> Any:
        # Same reason: the replacement may be this very task with these arguments.
        request = self.request
        hold = getattr(request, "redislock", None)
        if isinstance(hold, Hold):
            hold.release(request)
        return super().replace(sig)
