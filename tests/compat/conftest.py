"""Fixtures of the compat tests: the shims beside the originals.

``flavour`` runs a test once on the shims (``celery_redislock.compat``) and
once on celery-once 3.0.1 / celery-singleton 0.3.1 with the import changed
back, when they are installed (they are not a test dependency: the
comparison is skipped without them).  A test of a peer's bug marks its
``orig`` case ``xfail(strict=True)`` with the peer's issue: it must fail
there and pass on the shim.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import redis

FLAVOURS = ("shim", "orig")


def bug(issue: str) -> Any:
    """The ``flavour`` parameters of a test the original fails (``issue``)."""
    return [
        "shim",
        pytest.param("orig", marks=pytest.mark.xfail(strict=True, reason=issue)),
    ]


@pytest.fixture(scope="session")
def redis_base(redis_url: str) -> str:
    return redis_url.rsplit("/", 1)[0]


@pytest.fixture(scope="session")
def compat_app(redis_base: str) -> ModuleType:
    """``tests.compat_app``, pointed at the session's Redis, as the client side."""
    if "tests.compat_app" not in sys.modules:
        old = os.environ.get("REDISLOCK_TEST_REDIS")
        os.environ["REDISLOCK_TEST_REDIS"] = redis_base
        try:
            importlib.import_module("tests.compat_app")
        finally:
            if old is None:
                del os.environ["REDISLOCK_TEST_REDIS"]
            else:
                os.environ["REDISLOCK_TEST_REDIS"] = old
    module = sys.modules["tests.compat_app"]
    assert redis_base == module.BASE, "tests.compat_app was imported for another Redis"
    return module


@pytest.fixture(scope="session")
def rec(redis_base: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(f"{redis_base}/3")
    yield client
    client.close()


@pytest.fixture(scope="session")
def store(redis_base: str) -> Iterator[redis.Redis]:
    """db 4: the peers' store, and the shims' (they follow the peers' settings)."""
    client = redis.Redis.from_url(f"{redis_base}/4")
    yield client
    client.close()


def peer_classes(flavour: str) -> SimpleNamespace:
    """The five public names, from the shims or from the originals."""
    if flavour == "shim":
        from celery_redislock import compat

        return SimpleNamespace(
            QueueOnce=compat.QueueOnce,
            AlreadyQueued=compat.AlreadyQueued,
            Singleton=compat.Singleton,
            DuplicateTaskError=compat.DuplicateTaskError,
            clear_locks=compat.clear_locks,
        )
    once = pytest.importorskip("celery_once", reason="celery-once is not installed")
    singleton = pytest.importorskip("celery_singleton", reason="celery-singleton is not installed")
    # The originals cache one client per process (the first app's URL);
    # each test's app gets its own.
    once_redis = importlib.import_module("celery_once.backends.redis")
    singleton_backends = importlib.import_module("celery_singleton.backends")
    if once_redis.redis is not None:
        once_redis.redis.close()
        once_redis.redis = None
    if singleton_backends._backend is not None:
        singleton_backends._backend.redis.close()
        singleton_backends._backend = None
    return SimpleNamespace(
        QueueOnce=once.QueueOnce,
        AlreadyQueued=once.AlreadyQueued,
        Singleton=singleton.Singleton,
        DuplicateTaskError=singleton.DuplicateTaskError,
        clear_locks=singleton.clear_locks,
    )


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def peer(flavour: str) -> SimpleNamespace:
    return peer_classes(flavour)
