"""Where a Celery configuration (``app.conf``, or any mapping) puts the lock store.

In order: ``redislock_client``, ``redislock_url``, the broker when it is
Redis (Sentinel included, with its Sentinel options and TLS options), the
result backend when it is Redis.  :mod:`.lock_store` builds the client; no
Celery import here.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from . import _spelling
from .exceptions import ConfigurationError
from .lock_store import SENTINEL_OPTIONS

__all__ = ["Source", "missing", "source"]

#: URL schemes of a broker or result backend the lock store follows.
_FOLLOWED_SCHEMES = ("redis://", "rediss://", "unix://", "redis+socket://", "sentinel://")
#: Where the transport options and TLS options of a followed broker or backend are.
_FOLLOWED = {
    "broker_url": ("broker_transport_options", "broker_use_ssl"),
    "result_backend": ("result_backend_transport_options", "redis_backend_use_ssl"),
}


class Source(NamedTuple):
    """Where the lock store comes from: its URL and the setting naming it, the
    options followed with it (from the broker's or backend's settings)."""

    url: Optional[str]
    setting: str
    options: Optional[dict[str, Any]] = None
    options_setting: str = "redislock_transport_options"
    ssl: Optional[dict[str, Any]] = None
    ssl_setting: str = "redislock_ssl"


def source(conf: Any) -> Source:
    """Where a Celery configuration (``app.conf``, or any mapping) puts the lock
    store: ``redislock_client``, ``redislock_url``, the broker when it is Redis
    (Sentinel included), the result backend when it is Redis."""
    if conf.get("redislock_client"):
        return Source(None, _spelling.spelled(conf, "redislock_client"))
    url = conf.get("redislock_url")
    if url:
        setting = _spelling.spelled(conf, "redislock_url")
        return Source(url if isinstance(url, str) else ";".join(url), setting)
    for key, (options_key, ssl_key) in _FOLLOWED.items():
        value = conf.get(key)
        parts = value if isinstance(value, (list, tuple)) else str(value or "").split(";")
        parts = [p.strip() for p in parts if isinstance(p, str) and p.strip()]
        if not parts or not parts[0].startswith(_FOLLOWED_SCHEMES):
            continue
        setting = _spelling.spelled(conf, key)
        ssl = conf.get(ssl_key) if isinstance(conf.get(ssl_key), dict) else None
        ssl_setting = _spelling.spelled(conf, ssl_key)
        if parts[0].startswith("sentinel://"):
            # Sentinel's own options come along (the rest are kombu's or Celery's).
            followed = conf.get(options_key) or {}
            options = {k: v for k, v in followed.items() if k in SENTINEL_OPTIONS}
            sentinels = ";".join(p for p in parts if p.startswith("sentinel://"))
            return Source(
                sentinels, setting, options, _spelling.spelled(conf, options_key), ssl, ssl_setting
            )
        first = parts[0]  # (a failover list of brokers: the first)
        if first.startswith("redis+socket://"):
            first = "unix://" + first[len("redis+socket://") :]
        return Source(first, setting, None, ssl=ssl, ssl_setting=ssl_setting)
    return Source(None, "")


def missing(conf: Any) -> ConfigurationError:
    """The error of an app whose lock store is nowhere to be found."""
    broker = str(conf.get("broker_url") or "not set").split("://")[0]
    backend = str(conf.get("result_backend") or "not set").split("://")[0]
    return ConfigurationError(
        "celery_redislock needs a Redis lock store, and neither the broker "
        f"({broker}) nor the result backend ({backend}) is Redis: set "
        "redislock_url = 'redis://host:6379/0' in the app's configuration "
        "(or rediss://, unix://, redis+socket://, "
        "'sentinel://host:26379;sentinel://host2:26379' with "
        "redislock_transport_options = {'master_name': 'mymaster'}, "
        "'redis+cluster://host:7000,host:7001'), or redislock_client to a function "
        "returning a redis-py client"
    )
