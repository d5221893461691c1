"""Class preparation: check a LockedTask class's options and derive what its runs need.

Runs for every subclass as Python creates it (``__init_subclass__``), and
for a task class that ``redislock_tasks`` makes a LockedTask as it binds to
its app (:mod:`celery_redislock.tasks.configured`): bad options fail at
definition, before any run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any, Callable

from celery import Task
from kombu.utils.imports import symbol_by_name

from .. import _validate, config
from ..exceptions import LockContended
from ..unique import policy as unique_policy
from . import options, rate_stage, targets
from .lock_keys import KeySpec

__all__ = ["prepare"]

#: Celery's own request class, as task classes name it.
_CELERY_REQUEST = "celery.worker.request:Request"


def prepare(cls: Any, name: str, base: Any) -> None:
    """Check task class ``cls`` (named ``name``), a subclass of ``base``
    (LockedTask), and set what its runs derive from its options."""
    if not issubclass(LockContended, cls.throws):
        # A contention outcome (fail, skip, a wait that timed out) is an
        # expected error: Celery logs it in one line, without a traceback.
        cls.throws = (*cls.throws, LockContended)
    after = cls.__mro__[cls.__mro__.index(base) + 1 :]
    cls._redislock_direct = next(k for k in after if "__call__" in k.__dict__) is Task
    _combine_request(cls, after, base.Request)
    for option in (*options.OPTIONS, *unique_policy.CALL_OPTIONS):
        value = cls.__dict__.get(option)
        if value is not None:
            options.check_run_option(option, value, f"task {name!r}: option {option}")
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
    rate_limits = config.settings_for(app).rate_limits if app is not None else None
    rate_stage.check_options(cls, name, rate_limits)
    unique_values = {o: getattr(cls, o) for o in unique_policy.OPTIONS}
    unique_policy.check_combination(name, unique_values)
    cls._redislock_unique = any(
        unique_values[o] is not None for o in ("unique", "debounce", "throttle")
    )
    cls._redislock_rated = cls._redislock_rate is not None or cls.rate_limit_group is not None
    cls._redislock_locks = not cls._redislock_rated or (
        cls._redislock_unique or any(getattr(cls, o) is not None for o in options.SHAPE_OPTIONS)
    )
    unique_policy.check_guard(
        name,
        cls.unique,
        cls.unique_key,
        cls.lock_key,
        cls.semaphore,
        cls.concurrency_group,
        cls.lock_mode,
    )
    if "after_return" in cls.__dict__ and not getattr(
        cls.__dict__["after_return"], "_redislock_settles", False
    ):
        # A subclass's after_return may not call super(); the run's release
        # is settled after it either way (settling twice does nothing).
        cls.after_return = _settling(cls.__dict__["after_return"])
    if any(k in cls.__dict__ for k in ("run", "lock_key", "unique_key", "rate_limit_key")):
        # Celery stores run as a staticmethod unless bind=True; a plain
        # function (bind=True, or a class-based task) takes the task first.
        raw = inspect.getattr_static(cls, "run")
        bound = not isinstance(raw, staticmethod)
        cls._redislock_keyspec = KeySpec(name, cls.run, cls.lock_key, bound=bound)
        cls._redislock_unique_keyspec = (
            cls._redislock_keyspec
            if cls.unique_key is None
            else KeySpec(name, cls.run, cls.unique_key, bound=bound, option="unique_key")
        )
        cls._redislock_rate_keyspec = (
            None
            if cls.rate_limit_key is None
            else KeySpec(name, cls.run, cls.rate_limit_key, bound=bound, option="rate_limit_key")
        )


def _combine_request(cls: Any, after: Sequence[Any], ours_name: str) -> None:
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
    if theirs is None or theirs in (_CELERY_REQUEST, ours_name):
        if own is not None:
            cls.Request = ours_name
        return
    theirs = symbol_by_name(theirs) if isinstance(theirs, str) else theirs
    ours = symbol_by_name(ours_name)
    if issubclass(theirs, ours):
        return
    cls.Request = type(f"Locked{theirs.__name__}", (ours, theirs), {"__module__": __name__})


def _settling(after_return: Callable[..., Any]) -> Callable[..., Any]:
    """``after_return`` of a LockedTask subclass, followed by the run's settle."""

    @functools.wraps(after_return)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return after_return(self, *args, **kwargs)
        finally:
            self._redislock_settle()

    wrapper._redislock_settles = True  # type: ignore[attr-defined]
    return wrapper
