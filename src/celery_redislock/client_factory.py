"""``redislock_client``: a factory of a ready redis-py client, by object or dotted path.

No Celery here: :mod:`.config` calls :func:`from_factory` once per app and
process (after fork), and caches the client.
"""

from __future__ import annotations

import importlib
from typing import Any

import redis
from redis.cluster import RedisCluster

from .exceptions import ConfigurationError

__all__ = ["from_factory", "is_client", "name_of"]


def from_factory(factory: Any, where: str = "redislock_client") -> Any:
    """The client ``factory`` returns: a callable, or its dotted path
    (``"proj.redis:make_client"`` or ``"proj.redis.make_client"``)."""
    make = factory if callable(factory) else _imported(factory, where)
    client = make()
    if not is_client(client):
        raise ConfigurationError(
            f"{where} ({name_of(factory)}) returned {type(client).__name__}, not a redis-py "
            "client (redis.Redis, or redis.cluster.RedisCluster)"
        )
    return client


def is_client(value: Any) -> bool:
    """Whether ``value`` is a synchronous redis-py client the locks can run on."""
    return isinstance(value, (redis.Redis, RedisCluster))


def _imported(path: str, where: str) -> Any:
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    try:
        found: Any = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(f"{where}: cannot import {path!r}: {exc}") from exc
    if not callable(found):
        raise ConfigurationError(f"{where}: {path!r} is {found!r}, not a callable")
    return found


def name_of(factory: Any) -> str:
    if isinstance(factory, str):
        return factory
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    return f"{module}:{name}" if module else str(name)
