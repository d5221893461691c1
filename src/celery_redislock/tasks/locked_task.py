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

Per-run state lives on the request (``self.request.redislock``, the run's
:class:`~celery_redislock.tasks.hold.Hold`), never on the task instance,
which one worker process shares among its threads.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from kombu.utils.imports import symbol_by_name

from .. import _spelling, _validate, config, signals
from ..exceptions import BackendUnavailable, ConfigurationError, LockContended
from ..primitives import Primitive
from ..primitives.tokens import new_token, process
from . import parking, policies, startup, targets
from .hold import Hold
from .lock_keys import KeySpec

__all__ = ["LockedTask", "prepare"]

logger = logging.getLogger("celery_redislock")

#: Outcomes the tracer does not call after_return for (RETRY, IGNORED, REJECTED).
_NO_AFTER_RETURN = (Retry, Ignore, Reject)

#: Options that shape which primitive guards a run (the same for every call).
SHAPE_OPTIONS = ("lock_key", "lock_name", "semaphore", "concurrency_group", "lock_mode")

#: Task option -> Settings field supplying its default (each may also be given per call).
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

    _redislock_keyspec: Optional[KeySpec] = None
    #: Whether the next __call__ after LockedTask's in the MRO is Task's own.
    _redislock_direct = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery builds a class per decorated function (type(name, (base,),
        # options)) when the app finalizes or the task is first used, so this
        # runs before any run: bad options fail at definition, not mid-flight.
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        _check_option_names(cls, name)
        prepare(cls, name)

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
        if request is not None:
            overrides = policies.header(request, policies.CALL_OPTIONS_HEADER)
            if overrides and option in overrides:
                return overrides[option]
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
        return targets.target(self, args, kwargs)[0]

    def lock_target_for(
        self, args: Sequence[Any], kwargs: Optional[dict[str, Any]]
    ) -> tuple[str, Optional[str]]:
        """(name, kind) of the primitive guarding a call; kind None, "sem" or "rw"."""
        return targets.target(self, args, kwargs)

    # -- publishing ------------------------------------------------------------

    def apply_async(self, *args: Any, **options: Any) -> Any:
        """Celery's ``apply_async``, plus ``redislock={"option": value, ...}``: lock
        options for this call only (any of ``on_contention``, ``lock_ttl``,
        ``lock_renew_interval``, ``lock_retry_backoff``, ``lock_retry_backoff_max``,
        ``lock_retry_max``, ``lock_wait_timeout``, ``lock_wait_fallback``,
        ``lock_on_redis_error``); they travel in the message."""
        per_call = options.pop("redislock", None)
        headers = dict(options.get("headers") or {})
        if per_call:
            headers[policies.CALL_OPTIONS_HEADER] = check_call_options(self.name, per_call)
        policy = (per_call or {}).get("on_contention") or self.lock_option("on_contention")
        if policy == "park":
            # A parked run's place in line is its publish time (the order it
            # was submitted in), not the order worker processes reach Redis.
            headers.setdefault(parking.SENT_HEADER, round(time.time() * 1000, 3))
        if headers:
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
            if isinstance(exc, _NO_AFTER_RETURN):
                hold.release(request)  # no after_return to settle it
            else:
                hold.release_async(request)  # FAILURE: settled in after_return
            raise
        except BaseException:
            hold.release(request)  # the tracer lets these through: no after_return
            raise
        hold.release_async(request)  # SUCCESS: settled in after_return
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
        # or the retried run would find its own lock still held.
        self._redislock_release_now()
        return super().retry(*args, **kwargs)

    def replace(self, sig: Any) -> Any:
        # Same reason: the replacement may be this very task with these arguments.
        self._redislock_release_now()
        return super().replace(sig)

    def _redislock_release_now(self) -> None:
        request = self.request
        hold = getattr(request, "redislock", None)
        if isinstance(hold, Hold):
            hold.release(request)

    def _redislock_primitive(
        self, request: Any, name: str, kind: Optional[str], owner: str
    ) -> Primitive:
        settings = config.settings_for(self.app)
        prim = targets.build(
            self,
            name,
            kind,
            config.client_for(self.app),
            settings.semaphores,
            ttl=self.lock_option("lock_ttl", request),
            prefix=settings.key_prefix,
            renew_interval=self.lock_option("lock_renew_interval", request),
            owner=owner,
            fence_retention=settings.fence_retention,
            wait_replicas=settings.wait_replicas,
            wait_timeout_ms=settings.wait_timeout_ms,
        )
        prim.task = self  # type: ignore[attr-defined]  # for lock_lost receivers
        return parking.configure(
            prim, settings.park_reserve, parking.publisher(self.app, prim, kind)
        )

    def _redislock_enter(
        self, request: Any, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Optional[Hold]:
        signals.connect()
        name, kind = self.lock_target_for(args, kwargs)
        prim = self._redislock_primitive(
            request, name, kind, policies.owner_prefix(request.id, request.hostname, process.pid)
        )
        policy = policies.effective_policy(
            self.lock_option("on_contention", request), bool(request.is_eager)
        )
        try:
            if policy == "park":
                acquired = self._redislock_park(request, prim, kind)
            elif policy == "wait":
                acquired = prim.acquire(timeout=self.lock_option("lock_wait_timeout", request))
            else:
                acquired = prim.acquire(blocking=False)
        except BackendUnavailable as exc:
            self._redislock_unreachable(request, name, exc)
            return None
        if not acquired:
            policies.contended(self, request, prim, policy)
        hold = Hold(self, prim)
        request.redislock = hold
        request.lock_fence = prim.fence
        signals.lock_acquired.send(
            sender=self, request=request, key=prim.key, name=name, fence=prim.fence
        )
        return hold

    def _redislock_park(self, request: Any, prim: Primitive, kind: Optional[str]) -> bool:
        headers = policies.message_headers(request)
        token = headers.get(parking.PARK_HEADER)
        claim = token is not None
        if token is None:
            token = new_token(policies.owner_prefix(request.id, "park", 0))
            headers[parking.PARK_HEADER] = token
        sig = self.signature_from_request(request, headers=headers)
        payload = parking.encode(sig, self.serializer or self.app.conf.task_serializer)
        order = headers.get(parking.SENT_HEADER)
        status = parking.acquire_or_park(
            prim, token, payload, claim=claim, order_ms=float(order) if order else None
        )
        parking.ensure_sweeper(self.app)
        if status == "held":
            return True
        if status == "duplicate":
            logger.warning(
                "%s[%s]: a second delivery of a parked run that already ran; dropped",
                self.name,
                request.id,
            )
            raise Ignore("duplicate delivery of a parked run")
        policies.parked(self, request, prim, kind)
        return False  # pragma: no cover

    def _redislock_unreachable(self, request: Any, name: str, exc: BackendUnavailable) -> None:
        policy = self.lock_option("lock_on_redis_error", request)
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
            policies.retry_later(self, request, exc)
        raise exc


def prepare(cls: Any, name: str) -> None:
    """Check a LockedTask class's options and derive what its runs need.

    Runs for every subclass as Python creates it, and for a task class that
    ``redislock_tasks`` makes a LockedTask as it binds to its app
    (:mod:`celery_redislock.tasks.configured`).
    """
    if not issubclass(LockContended, cls.throws):
        # A contention outcome (fail, skip, a wait that timed out) is an
        # expected error: Celery logs it in one line, without a traceback.
        cls.throws = (*cls.throws, LockContended)
    after = cls.__mro__[cls.__mro__.index(LockedTask) + 1 :]
    cls._redislock_direct = next(k for k in after if "__call__" in k.__dict__) is Task
    _combine_request(cls, after)
    for option, field in OPTIONS.items():
        value = cls.__dict__.get(option)
        if value is not None:
            config.validate(field, value, f"task {name!r}: option {option}")
    lock_name = cls.__dict__.get("lock_name")
    if lock_name is not None:
        _validate.check_name(lock_name, f"task {name!r}: option lock_name")
    app = cls.__dict__.get("app") or cls.__dict__.get("_app")
    # Check the group against an app that configures groups.  Celery copies
    # shared tasks into every app created later; an app without any
    # redislock_semaphores is left to fail at the first run instead.
    groups = (
        config.settings_for(app).semaphores
        if (app is not None and cls.concurrency_group is not None)
        else None
    ) or None
    targets.check_options(name, cls.semaphore, cls.concurrency_group, cls.lock_mode, groups)
    if "after_return" in cls.__dict__ and not getattr(
        cls.__dict__["after_return"], "_redislock_settles", False
    ):
        # A subclass's after_return may not call super(); the run's release
        # is settled after it either way (settling twice does nothing).
        cls.after_return = _settling(cls.__dict__["after_return"])
    if "run" in cls.__dict__ or "lock_key" in cls.__dict__:
        # Celery stores run as a staticmethod unless bind=True; a plain
        # function (bind=True, or a class-based task) takes the task first.
        raw = inspect.getattr_static(cls, "run")
        bound = not isinstance(raw, staticmethod)
        cls._redislock_keyspec = KeySpec(name, cls.run, cls.lock_key, bound=bound)


#: Celery's own request class, as task classes name it.
_CELERY_REQUEST = "celery.worker.request:Request"


def _combine_request(cls: Any, after: Sequence[Any]) -> None:
    """Keep a request class of the task's own base (or its own) with ours on top.

    LockedTask's ``Request`` frees a killed child's lock in the worker's main
    process.  A base class after LockedTask in the MRO, or the task itself,
    may name a request class of its own: the task then gets a subclass of
    both, so neither behaviour is lost.
    """
    own = cls.__dict__.get("Request")
    theirs = (
        own
        if own is not None
        else next((k.__dict__["Request"] for k in after if "Request" in k.__dict__), None)
    )
    if theirs is None or theirs in (_CELERY_REQUEST, LockedTask.Request):
        if own is not None:
            cls.Request = LockedTask.Request
        return
    theirs = symbol_by_name(theirs) if isinstance(theirs, str) else theirs
    ours = symbol_by_name(LockedTask.Request)
    if issubclass(theirs, ours):
        return
    cls.Request = type(f"Locked{theirs.__name__}", (ours, theirs), {"__module__": __name__})


def _settling(after_return: Callable[..., Any]) -> Callable[..., Any]:
    """``after_return`` of a LockedTask subclass, followed by the run's settle."""

    @functools.wraps(after_return)
    def wrapper(self: LockedTask, *args: Any, **kwargs: Any) -> Any:
        try:
            return after_return(self, *args, **kwargs)
        finally:
            self._redislock_settle()

    wrapper._redislock_settles = True  # type: ignore[attr-defined]
    return wrapper


def check_call_options(task_name: str, options: Any) -> dict[str, Any]:
    """Validate the per-call options of one ``apply_async``; returns them as a dict."""
    if not isinstance(options, dict):
        raise ConfigurationError(
            f"task {task_name!r}: redislock= must be a dict of options, got {options!r}"
        )
    for option, value in options.items():
        field = OPTIONS.get(option)
        if field is None:
            raise ConfigurationError(
                f"task {task_name!r}: redislock={{{option!r}: ...}} is not a per-call option"
                + _spelling.suggestion(str(option), OPTIONS)
            )
        config.validate(field, value, f"task {task_name!r}: per-call option {option}")
    return dict(options)


def _check_option_names(cls: Any, task_name: str) -> None:
    """Refuse an option that looks like one of ours but is not (``lock_keys``,
    ``on_contension``): it would be ignored, silently."""
    valid = (*SHAPE_OPTIONS, *OPTIONS)
    for key, value in cls.__dict__.items():
        if key.startswith("_") or key in valid or _defined_in_body(cls, value):
            continue
        looks_ours = key.startswith(("lock_", "redislock_")) or (
            not any(key in k.__dict__ for k in Task.__mro__)  # (no getattr: some warn)
            and _spelling.closest(key, valid, cutoff=0.8) is not None
        )
        if looks_ours:
            raise ConfigurationError(
                f"task {task_name!r}: unknown option {key}={value!r}"
                + _spelling.suggestion(key, valid)
            )


def _defined_in_body(cls: Any, value: Any) -> bool:
    """A method or property of a class-based task, not a decorator option."""
    if isinstance(value, (staticmethod, classmethod, property)):
        return True
    qualname = getattr(value, "__qualname__", "")
    return inspect.isfunction(value) and qualname.startswith(f"{cls.__qualname__}.")
