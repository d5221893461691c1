"""Fixtures of the integration tests.

The test process talks to the same Redis as the workers through
``tests.celery_app`` (broker db 1, results db 2, locks db 0, recordings db 3).
Each test uses its own tags and job keys, so nothing is flushed between tests.
The primitives' modules (test_lock, test_semaphore, test_rwlock) opt in to
``no_leaked_leases``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_redislock.primitives import _keeper as renewal
from tests.redis_server import RedisServer, free_port
from tests.workers import Worker


@pytest.fixture
def stopped() -> Iterator[list[Worker]]:
    """Workers a test starts (appends) and that are stopped after it."""
    workers: list[Worker] = []
    yield workers
    for w in workers:
        w.stop()


@pytest.fixture
def lost_events() -> Iterator[list[tuple[Any, str]]]:
    """(lease, reason) of every lease the keeper reports lost during the test."""
    events: list[tuple[Any, str]] = []

    def listener(lease: Any, reason: str) -> None:
        events.append((lease, reason))

    renewal.add_lost_listener(listener)
    yield events
    renewal.remove_lost_listener(listener)


@pytest.fixture(scope="session")
def redis_base(redis_url: str) -> str:
    """``redis://host:port`` of the session's server, without a database."""
    return redis_url.rsplit("/", 1)[0]


@pytest.fixture(scope="session")
def capp(redis_base: str) -> ModuleType:
    """``tests.celery_app``, pointed at the session's Redis, as the client side."""
    if "tests.celery_app" not in sys.modules:
        # The module reads its Redis from the environment at import time.
        old = os.environ.get("REDISLOCK_TEST_REDIS")
        os.environ["REDISLOCK_TEST_REDIS"] = redis_base
        try:
            importlib.import_module("tests.celery_app")
        finally:
            if old is None:
                del os.environ["REDISLOCK_TEST_REDIS"]
            else:
                os.environ["REDISLOCK_TEST_REDIS"] = old
    module = sys.modules["tests.celery_app"]
    if redis_base != module.BASE:
        module.configure(redis_base)
    return module


@pytest.fixture(scope="session")
def uapp(capp: ModuleType) -> ModuleType:
    """``tests.unique_app``: tests.celery_app's app with the unique-job tasks."""
    return importlib.import_module("tests.unique_app")


@pytest.fixture(scope="session")
def rec(redis_base: str) -> Iterator[redis.Redis]:
    """Client on db 3, where task bodies and worker signal receivers record."""
    client = redis.Redis.from_url(f"{redis_base}/3")
    yield client
    client.close()


@pytest.fixture(scope="session")
def locks(redis_base: str) -> Iterator[redis.Redis]:
    """Client on db 0, the lock store."""
    client = redis.Redis.from_url(f"{redis_base}/0")
    yield client
    client.close()


@pytest.fixture
def no_leaked_leases() -> Iterator[None]:
    """Every test must leave this process's keeper with nothing to renew."""
    yield
    k = renewal.keeper()
    leftover = k.held()
    for token in k.tokens():
        k.discard(token)
    assert leftover == [], "the test left leases in the keeper"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server on TLS only, its self-signed certificate (for 127.0.0.1)
    at ``server.tls_ca``; skipped without openssl or a TLS build."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    made = subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        capture_output=True,
    )
    if made.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {made.stderr!r}")
    port = free_port()
    server = RedisServer(
        port,
        extra=[
            *("--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert)),
            *("--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)),
            *("--tls-auth-clients", "no"),
        ],
    )
    server.ping_options = {"ssl": True, "ssl_cert_reqs": "none"}
    server.tls_ca = str(cert)  # type: ignore[attr-defined]
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(f"this redis-server has no TLS: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def unix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The path of a redis-server's unix socket."""
    path = str(tmp_path_factory.mktemp("sock") / "redis.sock")
    server = RedisServer(extra=["--unixsocket", path, "--unixsocketperm", "700"]).start()
    yield path
    server.stop()
