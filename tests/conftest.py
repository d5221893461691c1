from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest
import redis

from tests.redis_server import RedisServer
from tests.sentinel import LocalSentinel, SentinelUnavailable


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A private redis-server for the session, or REDISLOCK_TEST_REDIS_URL when set."""
    url = os.environ.get("REDISLOCK_TEST_REDIS_URL")
    if url:
        yield url
        return
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        # Results still referenced unsubscribe as they are collected; let them
        # do so while the server is up (Celery before 5.5 reconnects, and
        # fails loudly, when it is gone).
        gc.collect()
        server.stop()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A client on a flushed database."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="module")
def topology() -> Iterator[LocalSentinel]:
    """A Sentinel topology for the module: a master, a replica and three
    sentinels (tests/sentinel.py); skipped where redis-server is missing."""
    try:
        sentinel = LocalSentinel()
    except SentinelUnavailable as exc:
        pytest.skip(str(exc))
    sentinel.start()
    yield sentinel
    sentinel.stop()
