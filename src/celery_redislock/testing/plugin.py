"""The pytest plugin (the ``pytest11`` entry point ``redislock``): a private Redis.

Loaded by pytest in every project that installs celery_redislock, so it
imports nothing heavy and starts nothing until a test asks for a fixture;
every name it adds starts with ``redislock_``.

- ``redislock_redis_server`` (session): a started :class:`RedisServer` on a
  free loopback port (the machine's redis-server, else the embedded one).
- ``redislock_redis_url`` (session): its URL, ``redis://127.0.0.1:PORT/0``.
- ``redislock_redis`` (function): a redis-py client on that database,
  flushed before the test.

Disable it with ``-p no:redislock``.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from .server import RedisServer, RedisServerNotFound

__all__ = ["redislock_redis", "redislock_redis_server", "redislock_redis_url"]


@pytest.fixture(scope="session")
def redislock_redis_server() -> Iterator[RedisServer]:
    """A private redis-server for the test session, stopped at its end."""
    try:
        server = RedisServer()
    except RedisServerNotFound as exc:
        pytest.fail(str(exc), pytrace=False)
    server.start()
    try:
        yield server
    finally:
        # Celery results still referenced unsubscribe as they are collected:
        # let them while the server is up (Celery before 5.5 reconnects, and
        # fails loudly, when it is gone).
        gc.collect()
        server.stop()


@pytest.fixture(scope="session")
def redislock_redis_url(redislock_redis_server: RedisServer) -> str:
    """The URL of the session's private redis-server (database 0)."""
    return redislock_redis_server.url


@pytest.fixture
def redislock_redis(redislock_redis_url: str) -> Iterator[Any]:
    """A redis-py client on the session server's database 0, flushed first."""
    import redis

    client = redis.Redis.from_url(redislock_redis_url)
    client.flushdb()
    yield client
    client.close()
