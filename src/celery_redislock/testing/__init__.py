"""Helpers for testing code that uses celery_redislock, and its pytest plugin.

- ``server.py``: :class:`RedisServer`, a throwaway redis-server on a free
  loopback port (the machine's, else the one ``celery-redislock[demo]``
  embeds), and :func:`find_redis_server`; the one place the project's tests,
  benchmarks and examples start Redis from.
- ``locks.py``: :func:`assert_lock_held`, :func:`assert_lock_free` and
  :func:`current_fence`, read from Redis through the inspect API.
- ``plugin.py``: the pytest plugin (``redislock_redis_url`` and friends).

What it may import: the public modules of every other layer, Celery and
pytest only inside functions or in plugin.py; only the demo imports it (its server).
"""

from __future__ import annotations

from .locks import assert_lock_free, assert_lock_held, current_fence, lock_entry
from .server import (
    MIN_VERSION,
    RedisServer,
    RedisServerNotFound,
    find_redis_server,
    free_port,
    redis_server,
)

__all__ = [
    "MIN_VERSION",
    "RedisServer",
    "RedisServerNotFound",
    "assert_lock_free",
    "assert_lock_held",
    "current_fence",
    "find_redis_server",
    "free_port",
    "lock_entry",
    "redis_server",
]
