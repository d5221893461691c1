"""The options of a LockedTask: their names, where their defaults come from, their checks.

Three groups:

- shape options (``SHAPE_OPTIONS``) decide which primitive guards a run and
  are the same for every call;
- run-time options (``OPTIONS``) each default to a ``redislock_*`` setting
  and may also be given per call (``apply_async(redislock={...})``);
- unique-job options (:data:`celery_redislock.unique.policy.OPTIONS`):
  ``unique``, ``unique_key``, ``unique_ttl``, ``on_duplicate``, ``debounce``,
  ``throttle``; all but ``unique_key`` may be given per call too;
- rate-limit options (``RATE_OPTIONS``): ``global_rate_limit``,
  ``rate_limit_key``, ``rate_limit_group`` (the same for every call) and
  ``on_rate_limited`` (a run-time option).
"""

from __future__ import annotations

import inspect
from typing import Any

from celery import Task

from .. import _spelling, setting_checks
from ..exceptions import ConfigurationError
from ..unique import policy as unique_policy

__all__ = [
    "CALL_OPTIONS",
    "OPTIONS",
    "RATE_OPTIONS",
    "SHAPE_OPTIONS",
    "VALID",
    "check_call_options",
    "check_option_names",
    "check_run_option",
]

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
    "lock_redis_error_retries": "redis_error_retries",
    "on_rate_limited": "on_rate_limited",
}

#: Options that shape a task's rate limit (the same for every call).
RATE_OPTIONS = ("global_rate_limit", "rate_limit_key", "rate_limit_group")

#: Options that may be given per call.
CALL_OPTIONS = (*OPTIONS, *unique_policy.CALL_OPTIONS)

#: Every option name a task class or a ``redislock_tasks`` pattern may set.
VALID = (*SHAPE_OPTIONS, *RATE_OPTIONS, *OPTIONS, *unique_policy.OPTIONS)


def check_run_option(option: str, value: Any, where: str) -> None:
    """Check one run-time or unique-job option's value; ``where`` names it."""
    field = OPTIONS.get(option)
    if field is not None:
        setting_checks.validate(field, value, where)
    elif option in unique_policy.OPTIONS:
        unique_policy.check_option(option, value, where)


def check_call_options(task_name: str, options: Any) -> dict[str, Any]:
    """Validate the per-call options of one ``apply_async``; returns them as a dict."""
    if not isinstance(options, dict):
        raise ConfigurationError(
            f"task {task_name!r}: redislock= must be a dict of options, got {options!r}"
        )
    for option, value in options.items():
        if option in VALID and option not in CALL_OPTIONS:
            raise ConfigurationError(
                f"task {task_name!r}: redislock={{{option!r}: ...}} is not a per-call option: "
                f"{option} decides which lock or key every call uses, so it is set on the task"
            )
        if option not in CALL_OPTIONS:
            raise ConfigurationError(
                f"task {task_name!r}: redislock={{{option!r}: ...}} is not a per-call option"
                + _spelling.suggestion(str(option), CALL_OPTIONS)
            )
        check_run_option(option, value, f"task {task_name!r}: per-call option {option}")
    return dict(options)


def check_option_names(cls: Any, task_name: str) -> None:
    """Refuse an option that looks like one of ours but is not (``lock_keys``,
    ``on_contension``, ``uniqe``): it would be ignored, silently.  A class's
    ``foreign_options`` names options of another library it reads itself
    (the :mod:`celery_redislock.compat` shims)."""
    foreign = getattr(cls, "foreign_options", ())
    for key, value in cls.__dict__.items():
        if key.startswith("_") or key in VALID or key in foreign or _defined_in_body(cls, value):
            continue
        looks_ours = key.startswith(("lock_", "redislock_", "unique_", "rate_limit_")) or (
            not any(key in k.__dict__ for k in Task.__mro__)  # (no getattr: some warn)
            and _spelling.closest(key, VALID, cutoff=0.8) is not None
        )
        if looks_ours:
            raise ConfigurationError(
                f"task {task_name!r}: unknown option {key}={value!r}"
                + _spelling.suggestion(key, VALID)
            )


def _defined_in_body(cls: Any, value: Any) -> bool:
    """A method or property of a class-based task, not a decorator option."""
    if isinstance(value, (staticmethod, classmethod, property)):
        return True
    qualname = getattr(value, "__qualname__", "")
    return inspect.isfunction(value) and qualname.startswith(f"{cls.__qualname__}.")
