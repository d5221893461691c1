"""The checks every layer shares: primitives' arguments, settings and task options.

Each check raises ConfigurationError whose message starts with ``what``
(e.g. ``"task 'proj.sync': option lock_ttl"``) and names the bad value.
The ``is_*`` predicates answer the same question without building a
message, for hot paths that only build one when a check fails.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Optional

from .exceptions import ConfigurationError

__all__ = [
    "check_bool",
    "check_choice",
    "check_count",
    "check_limits",
    "check_name",
    "check_seconds",
    "is_seconds",
    "named",
]


def is_seconds(value: object) -> bool:
    """A positive, finite int or float (not a bool): what check_seconds accepts."""
    return (type(value) is float or type(value) is int) and 0 < value < math.inf


def check_seconds(value: object, what: str, *, optional: bool = False) -> Optional[float]:
    """A positive, finite number of seconds (None too, when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{what} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{what} must be a positive number of seconds, got {value!r}")
    return float(value)


def check_count(value: object, what: str, *, minimum: int = 1, optional: bool = False) -> Any:
    """An int of at least ``minimum`` (None too, when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        none = "None or " if optional else ""
        raise ConfigurationError(f"{what} must be {none}an int >= {minimum}, got {value!r}")
    return value


def check_name(value: object, what: str) -> str:
    """A non-empty str."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty str, got {value!r}")
    return value


def check_choice(value: object, what: str, choices: Iterable[str]) -> str:
    """One of ``choices``."""
    options = tuple(choices)
    if value not in options:
        raise ConfigurationError(f"{what} must be one of {', '.join(options)}; got {value!r}")
    return str(value)


def check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{what} must be True or False, got {value!r}")
    return value


def check_limits(value: object, what: str) -> dict[str, int]:
    """A dict of name -> limit (an int >= 1), e.g. ``redislock_semaphores``."""
    if not isinstance(value, dict):
        raise ConfigurationError(f"{what} must be a dict of name -> limit, got {value!r}")
    for key, limit in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigurationError(f"{what} must map non-empty str names, got key {key!r}")
        check_count(limit, f"{what}[{key!r}]")
    return value


def named(what: str, name: str, known: dict[str, Any], setting: str) -> Any:
    """The value of ``name`` in the ``setting`` dict ``known`` (a named
    semaphore or rate limit a task joins); ``what`` (``"task 'x': option
    concurrency_group"``) names the option in the error when it is not there."""
    value = known.get(name)
    if value is None:
        listed = ", ".join(sorted(known)) or "none configured"
        raise ConfigurationError(f"{what}={name!r} is not in {setting} ({listed})")
    return value
