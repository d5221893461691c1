"""Helpers shared by the primitives: validation, tokens, error translation."""

from __future__ import annotations

import itertools
import math
import os
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .exceptions import BackendUnavailable, ConfigurationError

T = TypeVar("T")

#: A waiter's place in line is dropped this long after it should have woken.
GRACE_MS = 2000
#: "Wait forever", as sent to the scripts (they compare milliseconds).
FOREVER_MS = 2**40
#: Errors that mean Redis could not be reached, as opposed to a bad command.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)


def check_name(name: object, what: str = "name") -> str:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{what} must be a non-empty str, got {name!r}")
    return name


def check_seconds(value: object, what: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{what} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{what} must be a positive number of seconds, got {value!r}")
    return float(value)


def is_seconds(value: object) -> bool:
    """What :func:`check_seconds` accepts (not None), checked without building a message."""
    return (type(value) is float or type(value) is int) and 0 < value < math.inf


def to_ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class _Process:
    """This process's id and a random prefix for its tokens, renewed in a forked child."""

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self.pid = os.getpid()
        self.salt = secrets.token_hex(8)
        self.count = itertools.count()


#: os.getpid() and os.urandom() are system calls; a token needs neither per call.
process = _Process()
os.register_at_fork(after_in_child=process.renew)


def new_token(owner: str = "") -> str:
    """An owner token: the caller's prefix (e.g. a task id), then one that is unique
    to this process and call (64 random bits drawn when the process starts, and a
    counter)."""
    return f"{owner}{process.salt}{next(process.count):x}"


def call(op: str, key: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a Redis call, turning "cannot reach Redis" into BackendUnavailable."""
    try:
        return fn(*args, **kwargs)
    except UNREACHABLE as exc:
        raise unreachable(op, key, exc) from exc


def unreachable(op: str, key: str, exc: BaseException) -> BackendUnavailable:
    """The error :func:`call` raises when Redis could not be reached."""
    return BackendUnavailable(f"Redis unreachable during {op} of {key!r}: {exc}")


def block_cap(client: Any) -> float | None:
    """The longest a blocking command may block on ``client`` without a socket timeout."""
    try:
        timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
    except AttributeError:
        return None
    if not timeout:
        return None
    return max(0.05, float(timeout) - 0.25)


def decode(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
