from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from tests.cluster import LocalCluster
from tests.cluster import unavailable as cluster_unavailable
from tests.sentinel import LocalSentinel, SentinelUnavailable


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """REDISLOCK_TEST_REDIS_URL when set, else the library's pytest plugin's
    private redis-server (celery_redislock.testing.plugin: the suite dogfoods it)."""
    url = os.environ.get("REDISLOCK_TEST_REDIS_URL")
    if url:
        return url
    return str(request.getfixturevalue("redislock_redis_url"))


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


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[LocalCluster]:
    """A local 3-master Redis Cluster (no replicas) for the module
    (tests/cluster.py); skipped where it cannot be started."""
    reason = cluster_unavailable()
    if reason:
        pytest.skip(reason)
    cluster = LocalCluster(3).start()
    yield cluster
    cluster.stop()
