"""Settings read from ``app.conf`` (lowercase ``redislock_*`` keys), validated once.

Precedence for task options: per-call option (``apply_async(redislock={...})``) >
task attribute (decorator keyword argument) > app.conf > default.  Every
``redislock_*`` key is checked when the app finalizes and again when a worker
starts: a bad value, or a key that is not one of ours, is a ConfigurationError
naming the key as the user wrote it (``CELERY_REDISLOCK_LOCK_TTL`` in an app
configured with a namespace).

The lock store is, in order: ``redislock_client`` (a factory of a ready
client), ``redislock_url``, the broker when it is Redis (a Sentinel broker
included, with its ``broker_transport_options``), the result backend when it
is Redis.  The client is built lazily by :mod:`.lock_store`, once per app per
process (a forked child builds its own), and nothing is attached to the app
object.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

from . import _spelling, client_factory, lock_store, store_source
from .exceptions import ConfigurationError
from .setting_checks import (
    CONTENTION_POLICIES,
    RATE_LIMITED_POLICIES,
    check_rate_limits,
    validate,
)

__all__ = [
    "CONTENTION_POLICIES",
    "RATE_LIMITED_POLICIES",
    "Settings",
    "client_for",
    "describe_store",
    "require_store",
    "reset",
    "settings_for",
    "store",
]

#: ``redislock_*`` keys this library reads besides the Settings fields.
OTHER_KEYS: tuple[str, ...] = ("redislock_tasks",)


@dataclass(frozen=True)
class Settings:
    """Every ``redislock_*`` setting, in the order the docs list them.

    url: URL of the lock store (``redislock_url``): ``redis://``,
        ``rediss://``, ``unix://``, ``redis+socket://``,
        ``sentinel://h:26379;sentinel://h2:26379`` (or a list of them) or
        ``redis+cluster://h:7000,h2:7001``; defaults to the broker when it is
        Redis (Sentinel included), else the result backend when it is Redis,
        else None (a worker then refuses to start, unless ``client`` is set).
    ssl: TLS options of the lock store, as Celery's ``redis_backend_use_ssl``:
        a dict of ``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_certfile``,
        ``ssl_keyfile``; set, it turns TLS on (None: the URL's query, or
        redis-py's defaults; following the broker or backend, its
        ``broker_use_ssl`` or ``redis_backend_use_ssl``).
    transport_options: options of a ``sentinel://`` lock store, as Celery's
        ``broker_transport_options``: ``master_name``, ``sentinel_kwargs``,
        ``min_other_sentinels``; its other keys are redis-py connection
        keywords of any store.  Following a Sentinel broker or backend, its
        ``master_name``, ``sentinel_kwargs`` and ``min_other_sentinels``.
    client: a ready redis-py client for the lock store, for what a URL cannot
        say: a callable taking no argument, or its dotted path
        (``"proj.redis:make_client"``); called once per process, after fork.
        Beats ``url``.
    key_prefix: prefix of every Redis key (``redislock_key_prefix``).
    lock_ttl: lease in seconds, renewed while the body runs.
    renew_interval: seconds between renewals (None: a third of the lease).
    on_contention: ``retry``, ``skip``, ``wait``, ``fail`` or ``park``.
    lock_retry_backoff: first contention-retry delay, seconds (doubles each time).
    lock_retry_backoff_max: cap of that delay; must stay below the broker's
        visibility timeout.
    lock_retry_max: contention retries before failing with LockContended (None: no limit).
    lock_wait_timeout: seconds the ``wait`` policy blocks.
    lock_wait_fallback: what ``wait`` does after its timeout: ``retry`` or ``fail``.
    on_redis_error: when Redis is unreachable while taking a task's lock:
        ``retry`` (re-send later, the default), ``fail`` (FAILURE with
        BackendUnavailable) or ``run`` (run the body without a lock).
    redis_error_retries: re-sends of one run while the lock store is
        unreachable (``on_redis_error="retry"``) before it fails with
        BackendUnavailable (None: no limit).
    socket_timeout: socket timeout of the lock client, seconds.
    semaphores: named limits shared across tasks, ``{"name": limit}``
        (tasks join one with ``concurrency_group="name"``).
    park_reserve: seconds a parked task granted the lock may take to start
        before it is re-published (crash recovery of a lost hand-over).
    park_sweep_interval: seconds between recovery sweeps of parked queues.
    fence_retention: seconds a lock name's fence key is kept after its last
        grant (fences keep rising without it, from the server's clock; see
        docs/guarantees.md, "Fencing tokens").
    wait_replicas: replicas that must acknowledge every grant, renewal and
        release (``WAIT``) before it counts; 0: do not wait.  A grant not
        acknowledged in time is undone and counts as contention.
    wait_timeout_ms: how long each of those waits for its replicas, ms.
    unique_ttl: seconds a queued unique job holds its key at most (plus its
        countdown or ETA), so a message nobody consumes frees it.
    on_duplicate: what a duplicate publish of a unique job does: ``return``
        (the existing job's AsyncResult), ``raise`` (AlreadyQueued) or
        ``replace`` (queue it; the waiting one is dropped).
    rate_limits: named rate limits shared across tasks, ``{"name": rate}``
        (``"100/s"``, ``"1000/h"``, or starts per second; tasks join one with
        ``rate_limit_group="name"``); held parsed, as
        ``Rate`` values (``celery_redislock.primitives.rates``).
    on_rate_limited: what a run over its rate limit does: ``defer`` (re-sent
        once, to start at the slot it reserved), ``wait`` (sleeps in the
        worker until its slot, up to ``lock_wait_timeout``), ``skip``
        (TaskSkipped) or ``fail`` (RateLimited).
    metrics_port: TCP port a worker serves Prometheus metrics on, at
        ``/metrics`` (0 or None: off; needs the ``prometheus`` extra, and
        ``PROMETHEUS_MULTIPROC_DIR`` with the prefork pool; see
        :mod:`celery_redislock.ops.metrics`).
    metrics_addr: address that endpoint listens on.
    """

    url: Optional[str] = None
    ssl: Optional[dict[str, Any]] = None
    transport_options: dict[str, Any] = field(default_factory=dict)
    client: Any = None
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
    redis_error_retries: Optional[int] = 10
    socket_timeout: float = 10.0
    semaphores: dict[str, int] = field(default_factory=dict)
    park_reserve: float = 10.0
    park_sweep_interval: float = 1.0
    fence_retention: float = 600.0
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    unique_ttl: float = 3600.0
    on_duplicate: str = "return"
    rate_limits: dict[str, Any] = field(default_factory=dict)
    on_rate_limited: str = "defer"
    metrics_port: Optional[int] = None
    metrics_addr: str = "0.0.0.0"

    def __post_init__(self) -> None:
        for f in fields(self):
            validate(f.name, getattr(self, f.name), f"redislock_{f.name}")
        # Parsed once here, not at each run of a task that joins one.
        parsed = check_rate_limits(self.rate_limits, "redislock_rate_limits")
        object.__setattr__(self, "rate_limits", parsed)
        if self.lock_retry_backoff_max < self.lock_retry_backoff:
            raise ConfigurationError(
                f"redislock_lock_retry_backoff_max ({self.lock_retry_backoff_max!r}) "
                f"is below redislock_lock_retry_backoff ({self.lock_retry_backoff!r})"
            )


#: Settings whose default is not None, where None means something (no limit).
_NONE_IS_A_VALUE = ("redis_error_retries",)


def visibility_timeout(conf: Any) -> Optional[float]:
    """The broker's visibility timeout in seconds, for brokers that have one."""
    broker = conf.get("broker_url") or ""
    if not isinstance(broker, str) or not broker.startswith(("redis", "sqs", "sentinel")):
        return None
    options = conf.get("broker_transport_options") or {}
    return float(options.get("visibility_timeout", 3600))


def from_conf(conf: Any) -> Settings:
    """Build Settings from a Celery ``app.conf`` (or any mapping); errors name
    each key as the user wrote it."""
    fields_by_key = {f"redislock_{f.name}": f.name for f in fields(Settings)}
    for written, name in _spelling.keys_like(conf, "redislock_"):
        if name not in fields_by_key and name not in OTHER_KEYS:
            raise ConfigurationError(
                f"unknown setting {written!r}"
                + _spelling.suggestion(name, [*fields_by_key, *OTHER_KEYS])
            )
    values: dict[str, Any] = {}
    given = {name for _, name in _spelling.keys_like(conf, "redislock_")}
    for key, name in fields_by_key.items():
        value = conf.get(key)
        if value is None and key in given and name in _NONE_IS_A_VALUE:
            values[name] = None  # written as None: no limit, not the default
        elif value is not None:
            validate(name, value, _spelling.spelled(conf, key))
            if name == "url" and not isinstance(value, str):
                value = ";".join(value)  # a list of sentinels
            values[name] = value
    source = store_source.source(conf)
    if "url" not in values:
        values["url"] = source.url
    if "transport_options" not in values and source.options:
        values["transport_options"] = source.options
    if "ssl" not in values and source.ssl is not None:
        validate("ssl", source.ssl, source.ssl_setting)
        values["ssl"] = source.ssl
    settings = Settings(**values)
    vt = visibility_timeout(conf)
    if vt is not None and settings.lock_retry_backoff_max >= vt:
        # A countdown past the visibility timeout makes the broker redeliver
        # the message while the worker still holds it: a duplicate run.
        raise ConfigurationError(
            f"{_spelling.spelled(conf, 'redislock_lock_retry_backoff_max')} "
            f"({settings.lock_retry_backoff_max!r}) must stay below the broker's "
            f"visibility_timeout ({vt!r})"
        )
    return settings


def store(conf: Any) -> tuple[Optional[str], str]:
    """(URL of the lock store or None, the setting it came from)."""
    source = store_source.source(conf)
    return source.url, source.setting


def describe_store(store: Union[Settings, str, None]) -> str:
    """Where the lock store of ``store`` (settings, or a URL) is, without its
    password: ``redis://host:6379/0``, the sentinels and the master's name,
    the cluster's nodes, or the client factory."""
    if isinstance(store, Settings):
        return lock_store.describe(store.url, store.transport_options, store.client)
    return lock_store.describe(store)


def require_store(app: Any) -> Settings:
    """The settings of ``app``; ConfigurationError when it has no lock store."""
    settings = settings_for(app)
    if settings.url is None and settings.client is None:
        raise no_store(app.conf)
    return settings


def no_store(conf: Any) -> ConfigurationError:
    """The error of an app whose lock store is nowhere to be found."""
    return store_source.missing(conf)


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
    s = require_store(app)  # before taking _lock: settings_for takes it too
    with _lock:
        client = _clients.get(app)
        if client is None:
            client = _clients[app] = _connect(app.conf, s)
        _last = (weakref.ref(app), s, client)
    return client


def _connect(conf: Any, s: Settings) -> Any:
    if s.client is not None:
        return client_factory.from_factory(s.client, _spelling.spelled(conf, "redislock_client"))
    source = store_source.source(conf)
    options_setting = (
        _spelling.spelled(conf, "redislock_transport_options")
        if conf.get("redislock_transport_options") is not None
        else source.options_setting
    )
    assert s.url is not None
    return lock_store.connect(
        s.url,
        ssl=s.ssl,
        options=s.transport_options,
        socket_timeout=s.socket_timeout,
        url_setting=source.setting or "redislock_url",
        options_setting=options_setting,
    )


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
