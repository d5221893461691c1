"""The checks of the arguments every primitive takes, sync or asyncio."""

from __future__ import annotations

from typing import Any, Optional

from .. import _validate
from ..exceptions import ConfigurationError

__all__ = ["DEFAULT_FENCE_RETENTION", "DEFAULT_WAIT_TIMEOUT_MS", "check"]

#: How long a name's fence key is kept after its last grant, in seconds, by default.
DEFAULT_FENCE_RETENTION = 600.0
#: How long a grant, renewal or release waits for its replicas by default, ms.
DEFAULT_WAIT_TIMEOUT_MS = 1000


def check(
    noun: str,
    name: Any,
    ttl: Any,
    *,
    timeout: Any = None,
    renew_interval: Any = None,
    prefix: Any = "redislock",
    fence_retention: Any = DEFAULT_FENCE_RETENTION,
    wait_replicas: Any = 0,
    wait_timeout_ms: Any = DEFAULT_WAIT_TIMEOUT_MS,
) -> Optional[tuple[int, int]]:
    """Raise ConfigurationError naming the first bad argument of the ``noun``
    (``"lock"``, ``"semaphore"``...) called ``name``; else the ``(replicas,
    timeout ms)`` every grant, renewal and release waits for, or None."""
    seconds = _validate.is_seconds
    if not (
        seconds(ttl)
        and seconds(fence_retention)
        and (timeout is None or seconds(timeout))
        and (renew_interval is None or (seconds(renew_interval) and renew_interval < ttl))
        and type(name) is str
        and name
        and type(prefix) is str
        and prefix
    ):
        # The full checks, and their messages, only when the quick one fails
        # (or for number subclasses): a task builds a primitive per run.
        _full_check(noun, name, ttl, timeout, renew_interval, prefix, fence_retention)
    if not wait_replicas and wait_timeout_ms == DEFAULT_WAIT_TIMEOUT_MS:
        return None
    what = f"{noun} {name!r}"
    _validate.check_count(wait_replicas, f"wait_replicas of {what}", minimum=0)
    _validate.check_count(wait_timeout_ms, f"wait_timeout_ms of {what}", minimum=1)
    return (int(wait_replicas), int(wait_timeout_ms)) if wait_replicas else None


def _full_check(
    noun: str,
    name: Any,
    ttl: Any,
    timeout: Any,
    renew_interval: Any,
    prefix: Any,
    fence_retention: Any,
) -> None:
    what = f"{noun} {name!r}"
    _validate.check_name(name, f"{noun} name")
    seconds = _validate.check_seconds(ttl, f"ttl of {what}")
    _validate.check_seconds(timeout, f"timeout of {what}", optional=True)
    interval = _validate.check_seconds(renew_interval, f"renew_interval of {what}", optional=True)
    if interval is not None and seconds is not None and interval >= seconds:
        raise ConfigurationError(
            f"renew_interval of {what} must be shorter than its ttl ({seconds}), got {interval!r}"
        )
    _validate.check_name(prefix, "prefix")
    _validate.check_seconds(fence_retention, f"fence_retention of {what}")
