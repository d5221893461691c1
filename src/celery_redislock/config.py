"""Settings read from ``app.conf`` (lowercase ``redislock_*`` keys), validated once.

Precedence for task options: per-call option > task attribute > app.conf > default.
The Redis client is built lazily, once per app per process (a forked child
builds its own), and nothing is attached to the app object.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from dataclasses import dataclass, field, fields
from typing import Any, Optional

import redis

from .exceptions import ConfigurationError

__all__ = ["CONTENTION_POLICIES", "Settings", "client_for", "reset", "settings_for"]

CONTENTION_POLICIES = ("retry", "skip", "wait", "fail", "park")
WAIT_FALLBACKS = ("retry", "fail")
REDIS_ERROR_POLICIES = ("retry", "fail", "run")
DEFAULT_URL = "redis://localhost:6379/0"


@dataclass(frozen=True)
class Settings:
    """Every ``redislock_*`` setting, in the order the docs list them.

    url: Redis URL of the lock store (``redislock_url``); defaults to the
        broker URL when that is a redis:// or rediss:// URL.
    key_prefix: prefix of every Redis key (``redislock_key_prefix``).
    lock_ttl: lease in seconds, renewed while the body runs.
    renew_interval: seconds between renewals (None: a third of the lease).
    on_contention: ``retry``, ``skip``, ``wait`` or ``fail``.
    lock_retry_backoff: first contention-retry delay, seconds (doubles each time).
    lock_retry_backoff_max: cap of that delay; must stay below the broker's
        visibility timeout.
    lock_retry_max: contention retries before failing with LockContended (None: no limit).
    lock_wait_timeout: seconds the ``wait`` policy blocks.
    lock_wait_fallback: what ``wait`` does after its timeout: ``retry`` or ``fail``.
    on_redis_error: when Redis is unreachable while taking a task's lock:
        ``retry`` (re-send later, the default), ``fail`` (FAILURE with
        BackendUnavailable) or ``run`` (run the body without a lock).
    socket_timeout: socket timeout of the lock client, seconds.
    semaphores: named limits shared across tasks, ``{"name": limit}``
        (tasks join one with ``concurrency_group="name"``).
    park_reserve: seconds a parked task granted the lock may take to start
        before it is re-published (crash recovery of a lost hand-over).
    park_sweep_interval: seconds between recovery sweeps of parked queues.
    release_with_result: when a run's result goes to a Redis result backend
        on the lock store's server, release the lock in the transaction that
        stores the result (no round trip of its own; see fold.py).  False:
        release as the body ends, on the lock client.
    """

    url: str = DEFAULT_URL
    key_prefix: str = "redislock"
    lock_ttl: float = 30.0
    renew_interval: Optional[float] = None
    on_contention: str = "retry"
    lock_retry_backoff: float = 1.0
    lock_retry_backoff_max: float = 30.0
    lock_retry_max: Optional[int] = None
    lock_wait_timeout: float = 60.0
    lock_wait_fallback: str = "retry"
    on_redis_error: str = "retry"
    socket_timeout: float = 10.0
    semaphores: dict[str, int] = field(default_factory=dict)
    park_reserve: float = 10.0
    park_sweep_interval: float = 1.0
    release_with_result: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            validate(f.name, getattr(self, f.name), f"redislock_{f.name}")
        if self.lock_retry_backoff_max < self.lock_retry_backoff:
            raise ConfigurationError(
                f"redislock_lock_retry_backoff_max ({self.lock_retry_backoff_max!r}) "
                f"is below redislock_lock_retry_backoff ({self.lock_retry_backoff!r})"
            )


def _positive(value: Any, where: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{where} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{where} must be positive, got {value!r}")


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigurationError(f"{where} must be one of {', '.join(choices)}; got {value!r}")


def validate(name: str, value: Any, where: str) -> None:
    """Check one setting or task option; ``where`` names it in the error."""
    if name in (
        "lock_ttl",
        "lock_retry_backoff",
        "lock_retry_backoff_max",
        "lock_wait_timeout",
        "socket_timeout",
        "park_reserve",
        "park_sweep_interval",
    ):
        _positive(value, where)
    elif name == "renew_interval":
        _positive(value, where, optional=True)
    elif name == "lock_retry_max":
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ConfigurationError(f"{where} must be None or an int >= 0, got {value!r}")
    elif name == "on_contention":
        _choice(value, where, CONTENTION_POLICIES)
    elif name == "lock_wait_fallback":
        _choice(value, where, WAIT_FALLBACKS)
    elif name == "on_redis_error":
        _choice(value, where, REDIS_ERROR_POLICIES)
    elif name in ("url", "key_prefix"):
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"{where} must be a non-empty str, got {value!r}")
    elif name == "release_with_result":
        if not isinstance(value, bool):
            raise ConfigurationError(f"{where} must be True or False, got {value!r}")
    elif name == "semaphores":
        if not isinstance(value, dict):
            raise ConfigurationError(f"{where} must be a dict of name -> limit, got {value!r}")
        for key, limit in value.items():
            if (
                not isinstance(key, str)
                or isinstance(limit, bool)
                or not isinstance(limit, int)
                or limit < 1
            ):
                raise ConfigurationError(
                    f"{where}[{key!r}] must map a str to an int >= 1, got {limit!r}"
                )


def _default_url(conf: Any) -> str:
    broker = conf.get("broker_url") or ""
    if isinstance(broker, str) and broker.startswith(("redis://", "rediss://")):
        return broker.split(";")[0]
    return DEFAULT_URL


def visibility_timeout(conf: Any) -> Optional[float]:
    """The broker's visibility timeout in seconds, for brokers that have one."""
    broker = conf.get("broker_url") or ""
    if not isinstance(broker, str) or not broker.startswith(("redis", "sqs", "rediss")):
        return None
    options = conf.get("broker_transport_options") or {}
    return float(options.get("visibility_timeout", 3600))


def from_conf(conf: Any) -> Settings:
    """Build Settings from a Celery ``app.conf`` (or any mapping)."""
    values: dict[str, Any] = {}
    for f in fields(Settings):
        key = f"redislock_{f.name}"
        value = conf.get(key)
        if value is not None:
            values[f.name] = value
    values.setdefault("url", _default_url(conf))
    settings = Settings(**values)
    vt = visibility_timeout(conf)
    if vt is not None and settings.lock_retry_backoff_max >= vt:
        # A countdown past the visibility timeout makes the broker redeliver
        # the message while the worker still holds it: a duplicate run.
        raise ConfigurationError(
            f"redislock_lock_retry_backoff_max ({settings.lock_retry_backoff_max!r}) must stay "
            f"below the broker's visibility_timeout ({vt!r})"
        )
    return settings


_lock = threading.Lock()
_settings: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()
_clients: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


#: (app, its settings, its client or None) asked for last, the app weakly:
#: a worker asks for one app's, several times per task.
_last: tuple[Any, Optional[Settings], Any] = (lambda: None, None, None)


def settings_for(app: Any) -> Settings:
    """The validated settings of ``app``, built on first use."""
    last_app, s, _ = _last
    if last_app() is app and s is not None:
        return s
    s = _settings.get(app)
    if s is None:
        with _lock:
            s = _settings.get(app)
            if s is None:
                s = _settings[app] = from_conf(app.conf)
    return s


def client_for(app: Any) -> Any:
    """The lock client of ``app`` in this process, built on first use."""
    global _last
    last_app, _, client = _last
    if last_app() is app and client is not None:
        return client
    s = settings_for(app)  # before taking _lock: settings_for takes it too
    with _lock:
        client = _clients.get(app)
        if client is None:
            client = _clients[app] = redis.Redis.from_url(
                s.url,
                socket_timeout=s.socket_timeout,
                socket_connect_timeout=min(s.socket_timeout, 5.0),
                health_check_interval=30,
            )
        _last = (weakref.ref(app), s, client)
    return client


def reset(app: Any) -> None:
    """Forget the cached settings and client of ``app`` (after changing app.conf)."""
    global _last
    with _lock:
        _settings.pop(app, None)
        _clients.pop(app, None)
        _last = (lambda: None, None, None)


def _after_fork_in_child() -> None:
    # A child builds its own client (the parent's sockets are not its own);
    # a fork hook rather than a pid check per call: os.getpid() is a system call.
    global _lock, _last
    _lock = threading.Lock()
    _clients.clear()
    _last = (lambda: None, None, None)


os.register_at_fork(after_in_child=_after_fork_in_child)
