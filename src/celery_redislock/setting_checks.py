"""How each ``redislock_*`` setting and task option is checked: one function,
:func:`validate`, for both (a task option defaults to a setting, and is
checked the same way), and the choices of each policy option.
"""

from __future__ import annotations

from typing import Any

from . import _validate, lock_store
from .exceptions import ConfigurationError
from .primitives import rates
from .primitives.rates import Rate

__all__ = [
    "CONTENTION_POLICIES",
    "DUPLICATE_ACTIONS",
    "RATE_LIMITED_POLICIES",
    "REDIS_ERROR_POLICIES",
    "WAIT_FALLBACKS",
    "check_rate_limits",
    "validate",
]

CONTENTION_POLICIES = ("retry", "skip", "wait", "fail", "park")
DUPLICATE_ACTIONS = ("return", "raise", "replace")
WAIT_FALLBACKS = ("retry", "fail")
REDIS_ERROR_POLICIES = ("retry", "fail", "run")
RATE_LIMITED_POLICIES = ("defer", "wait", "skip", "fail")

#: Setting -> how to check it (the same checks serve task options).
_SECONDS = (
    "fence_retention",
    "lock_ttl",
    "lock_retry_backoff",
    "lock_retry_backoff_max",
    "lock_wait_timeout",
    "socket_timeout",
    "park_reserve",
    "park_sweep_interval",
    "unique_ttl",
)


def validate(name: str, value: Any, where: str) -> None:
    """Check one setting or task option; ``where`` names it in the error."""
    if name in _SECONDS:
        _validate.check_seconds(value, where)
    elif name == "renew_interval":
        _validate.check_seconds(value, where, optional=True)
    elif name == "lock_retry_max":
        _validate.check_count(value, where, minimum=0, optional=True)
    elif name == "on_contention":
        _validate.check_choice(value, where, CONTENTION_POLICIES)
    elif name == "lock_wait_fallback":
        _validate.check_choice(value, where, WAIT_FALLBACKS)
    elif name == "on_redis_error":
        _validate.check_choice(value, where, REDIS_ERROR_POLICIES)
    elif name == "url":
        if isinstance(value, (list, tuple)) and value:
            for item in value:
                if not isinstance(item, str) or not item.startswith("sentinel://"):
                    raise ConfigurationError(
                        f"{where} may be a list of sentinel:// URLs only, got {item!r} in it"
                    )
        elif value is not None:
            _validate.check_name(value, where)
    elif name == "ssl":
        if value is not None:
            lock_store.tls_options(value, where)
    elif name == "transport_options":
        if not isinstance(value, dict):
            raise ConfigurationError(f"{where} must be a dict, got {value!r}")
        for key in value:
            if not isinstance(key, str):
                raise ConfigurationError(f"{where} keys must be str, got {key!r}")
    elif name == "client":
        if value is not None and not callable(value):
            _validate.check_name(value, where)
            if ":" not in value and "." not in value:
                raise ConfigurationError(
                    f"{where} must be a callable or its dotted path ('proj.redis:make_client'), "
                    f"got {value!r}"
                )
    elif name == "redis_error_retries":
        _validate.check_count(value, where, minimum=0, optional=True)
    elif name == "key_prefix":
        _validate.check_name(value, where)
    elif name == "semaphores":
        _validate.check_limits(value, where)
    elif name == "rate_limits":
        check_rate_limits(value, where)
    elif name == "on_rate_limited":
        _validate.check_choice(value, where, RATE_LIMITED_POLICIES)
    elif name == "wait_replicas":
        _validate.check_count(value, where, minimum=0)
    elif name == "wait_timeout_ms":
        _validate.check_count(value, where, minimum=1)
    elif name == "on_duplicate":
        _validate.check_choice(value, where, DUPLICATE_ACTIONS)
    elif name == "metrics_port":
        _validate.check_count(value, where, minimum=0, optional=True)
        if value is not None and value > 65535:
            raise ConfigurationError(f"{where} must be a port, 1 to 65535 (0: off), got {value!r}")
    elif name == "metrics_addr":
        _validate.check_name(value, where)


def check_rate_limits(value: Any, where: str) -> dict[str, Rate]:
    """``redislock_rate_limits``, each limit parsed (an error names the group)."""
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where} must be a dict of {{name: rate}}, got {value!r}")
    limits = {}
    for group, limit in value.items():
        _validate.check_name(group, f"{where}: a group name")
        limits[group] = rates.rate(limit, f"{where}[{group!r}]")
    return limits
