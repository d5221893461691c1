"""Every form of lock store, on a real prefork worker (tests/store_app.py).

A Sentinel broker and result backend the store follows; ``sentinel://`` in
``redislock_url``; a ``redis+cluster://`` URL; TLS with ``redislock_ssl``; a
unix socket; a ``redislock_client`` factory.  Each worker runs contended
locked tasks (retry), parked ones (hand-over) and, on most, a unique job,
and the test looks where the keys went; ``celery redislock ls`` reads the
same store from the app's configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from celery_redislock import config
from celery_redislock.inspect import Inspector
from tests import cluster as local_cluster
from tests.cluster import LocalCluster
from tests.helpers import assert_no_overlap, assert_rising, wait_until
from tests.integration.task_helpers import collect, runs, start_worker, uniq, wait_runs
from tests.redis_server import RedisServer
from tests.sentinel import LocalSentinel
from tests.store_app import make_app
from tests.workers import ROOT, Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

CONTENDERS = 3
#: redis-py 5.0.0 cannot subscribe through a Sentinel pool (fixed in 5.0.1):
#: kombu's broadcast queue and Celery's result consumer both do.
SENTINEL_PUBSUB_BROKEN = tuple(map(int, redis.__version__.split(".")[:3])) < (5, 0, 1)
BODY = 0.25


def store_worker(
    redis_base: str,
    stopped: list[Worker],
    name: str,
    conf: dict[str, Any],
    env: dict[str, str] | None = None,
) -> tuple[Worker, Any]:
    """A worker of tests.store_app with ``conf``, and the same app for the test
    process (its publish side reaches the store as the worker does)."""
    env = {"REDISLOCK_TEST_STORE_CONF": json.dumps(conf), **(env or {})}
    worker = start_worker(redis_base, name, concurrency=3, app="tests.store_app", env=env)
    stopped.append(worker)
    return worker, make_app(conf, main=f"client-{name}")


def contend(app: Any, rec: redis.Redis, task: str, job: str) -> list[dict[str, Any]]:
    """CONTENDERS runs of ``task`` on ``job`` at once: each runs once, none overlap."""
    tag = uniq(task)
    results = [
        app.signature(task, (job, tag, BODY, seq)).apply_async() for seq in range(CONTENDERS)
    ]
    _, errors = collect(results, timeout=15)
    assert errors == []
    records = sorted(runs(rec, tag), key=lambda r: r["start"])
    assert sorted(r["seq"] for r in records) == list(range(CONTENDERS))
    assert_no_overlap(records)
    assert_rising([r["fence"] for r in records])
    return records


def unique_once(app: Any, rec: redis.Redis, job: str) -> None:
    """A unique job published twice runs once; the second publish gets the first's id."""
    tag = uniq("unique")
    first = app.signature("s.unique", (job, tag, BODY)).apply_async()
    second = app.signature("s.unique", (job, tag, BODY)).apply_async()
    assert second.id == first.id
    first.get(timeout=20)
    assert len(wait_runs(rec, tag, 1, 5)) == 1


def exercise(app: Any, rec: redis.Redis, job: str, unique: bool = True) -> None:
    contend(app, rec, "s.retry", job)
    contend(app, rec, "s.park", f"{job}-park")
    if unique:
        unique_once(app, rec, f"{job}-unique")


def fences(client: Any, job: str) -> list[bytes]:
    """The fence keys of ``job``'s locks in ``client``'s database."""
    return sorted(client.scan_iter(match=f"redislock:*{job}*:fence", count=1000))


def logged_store(worker: Worker) -> str:
    lines = [x for x in worker.output().splitlines() if "celery_redislock: lock store" in x]
    assert len(lines) == 1, worker.output()
    return lines[0]


def listed_while_held(app: Any, conf: dict[str, Any], redis_base: str, job: str) -> None:
    """A run holds ``job``'s lock: the inspect API and ``celery redislock ls``
    (built from the same configuration) both list it."""
    held = app.signature("s.retry", (job, uniq("held"), 3.0)).apply_async()
    inspector = Inspector.from_app(app)
    wait_until(
        lambda: [e for e in inspector.entries(f"*{job}*") if e.holders],
        10,
        what=f"the inspect API to list {job} held",
    )
    listed = cli_ls(conf, redis_base)
    assert [e["holders"][0]["task_id"] for e in listed if job in e["name"]] == [held.id], listed
    held.get(timeout=10)


def cli(conf: dict[str, Any], redis_base: str, *args: str) -> str:
    """The output of ``celery -A tests.store_app redislock ARGS`` with ``conf``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "REDISLOCK_TEST_REDIS": redis_base,
        "REDISLOCK_TEST_STORE_CONF": json.dumps(conf),
    }
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.store_app", "redislock", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def cli_ls(conf: dict[str, Any], redis_base: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = json.loads(cli(conf, redis_base, "ls", "--json"))
    return listed


# -- Sentinel ----------------------------------------------------------------------------


def sentinel_urls(topology: LocalSentinel, db: int) -> list[str]:
    return [f"sentinel://127.0.0.1:{port}/{db}" for port in topology.sentinel_ports]


@pytest.mark.skipif(
    SENTINEL_PUBSUB_BROKEN,
    reason="redis-py 5.0.0's SentinelManagedConnection.read_response() takes no push_request: "
    "a worker on a Sentinel broker dies at its first broadcast message (a Sentinel lock store "
    "under a Redis broker is tested below)",
)
def test_a_sentinel_broker_and_backend_carry_the_locks_to_their_master(
    topology: LocalSentinel, redis_base: str, rec: redis.Redis, stopped: list[Worker]
) -> None:
    conf = {
        "broker_url": ";".join(sentinel_urls(topology, 1)),
        "broker_transport_options": {"master_name": "mymaster", "visibility_timeout": 60},
        "result_backend": ";".join(sentinel_urls(topology, 2)),
        "result_backend_transport_options": {"master_name": "mymaster"},
    }
    worker, app = store_worker(redis_base, stopped, "sentinel-broker", conf)
    sentinels = ",".join(f"127.0.0.1:{p}" for p in topology.sentinel_ports)
    described = f"sentinel://{sentinels} (master mymaster, db 1)"
    assert f"{described} (from broker_url)" in logged_store(worker)
    assert config.describe_store(config.settings_for(app)) == described
    job = uniq("sentinel-broker")
    exercise(app, rec, job)
    # The locks are on the master, in the broker's database.
    with redis.Redis(port=topology.master_port(), db=1) as master:
        assert len(fences(master, job)) == 3  # retry, park, unique
    app.close()


def test_a_sentinel_lock_store_from_redislock_url_with_a_redis_broker(
    topology: LocalSentinel, redis_base: str, rec: redis.Redis, stopped: list[Worker]
) -> None:
    conf = {
        "broker_url": f"{redis_base}/1",
        "result_backend": f"{redis_base}/2",
        "redislock_url": sentinel_urls(topology, 0),  # a list, as Celery takes
        "redislock_transport_options": {"master_name": "mymaster", "db": 4},
    }
    worker, app = store_worker(redis_base, stopped, "sentinel-url", conf)
    assert "(from redislock_url)" in logged_store(worker)
    job = uniq("sentinel-url")
    exercise(app, rec, job, unique=False)
    with redis.Redis(port=topology.master_port(), db=4) as master:
        assert len(fences(master, job)) == 2
    listed_while_held(app, conf, redis_base, f"{job}-held")
    app.close()


# -- Redis Cluster -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    why = local_cluster.unavailable()
    if why:
        pytest.skip(why)
    nodes = LocalCluster(3).start()
    yield nodes
    nodes.stop()


def test_a_cluster_lock_store_from_its_url(
    cluster: LocalCluster, redis_base: str, rec: redis.Redis, stopped: list[Worker]
) -> None:
    first, second, _ = cluster.ports
    conf = {
        "broker_url": f"{redis_base}/1",
        "result_backend": f"{redis_base}/2",
        "redislock_url": f"redis+cluster://127.0.0.1:{first},127.0.0.1:{second}",
    }
    worker, app = store_worker(redis_base, stopped, "cluster", conf)
    assert f"redis+cluster://127.0.0.1:{first},127.0.0.1:{second} (from redislock_url)" in (
        logged_store(worker)
    )
    job = uniq("cluster")
    exercise(app, rec, job)
    client = RedisCluster(host="127.0.0.1", port=first)
    try:
        found = client.scan_iter(match=f"redislock:*{job}*:fence", target_nodes="primaries")
        assert len(set(found)) == 3
    finally:
        client.close()
    listed_while_held(app, conf, redis_base, f"{job}-held")
    checked = cli(conf, redis_base, "check")
    assert f"lock store: {conf['redislock_url']} (from redislock_url), reached" in checked
    app.close()


# -- TLS, a unix socket, a client factory ---------------------------------------------------


def test_a_tls_lock_store_verified_against_its_ca(
    tls_server: RedisServer, redis_base: str, rec: redis.Redis, stopped: list[Worker]
) -> None:
    conf = {
        "broker_url": f"{redis_base}/1",
        "result_backend": f"{redis_base}/2",
        "redislock_url": f"rediss://127.0.0.1:{tls_server.port}/0",
        "redislock_ssl": {"ssl_cert_reqs": "required", "ssl_ca_certs": tls_server.tls_ca},  # type: ignore[attr-defined]
    }
    worker, app = store_worker(redis_base, stopped, "tls", conf)
    assert f"rediss://127.0.0.1:{tls_server.port}/0 (from redislock_url)" in logged_store(worker)
    job = uniq("tls")
    contend(app, rec, "s.retry", job)
    with redis.Redis(port=tls_server.port, ssl=True, ssl_cert_reqs="none") as store:
        assert len(fences(store, job)) == 1
    app.close()


def test_a_unix_socket_lock_store(
    unix_server: str, redis_base: str, rec: redis.Redis, stopped: list[Worker]
) -> None:
    conf = {
        "broker_url": f"{redis_base}/1",
        "result_backend": f"{redis_base}/2",
        "redislock_url": f"unix://{unix_server}?db=3",
    }
    worker, app = store_worker(redis_base, stopped, "unix", conf)
    assert f"unix://{unix_server}/3 (from redislock_url)" in logged_store(worker)
    job = uniq("unix")
    contend(app, rec, "s.park", job)
    with redis.Redis(unix_socket_path=unix_server, db=3) as store:
        assert len(fences(store, job)) == 1
    app.close()


def test_a_client_factory_is_called_once_per_process(
    redis_base: str, rec: redis.Redis, stopped: list[Worker], capp: ModuleType
) -> None:
    # (capp: tests.celery_app's recorder, which the factory records with, is the session's.)
    calls = uniq("factory-calls")
    conf = {
        "broker_url": f"{redis_base}/1",
        "result_backend": f"{redis_base}/2",
        "redislock_client": "tests.store_app:make_client",
    }
    env = {"REDISLOCK_TEST_FACTORY_TAG": calls, "REDISLOCK_TEST_FACTORY_URL": f"{redis_base}/5"}
    os.environ.update(env)  # the test process's app calls the factory too
    try:
        worker, app = store_worker(redis_base, stopped, "factory", conf, env=env)
        assert "the client of tests.store_app:make_client (from redislock_client)" in (
            logged_store(worker)
        )
        job = uniq("factory")
        records = contend(app, rec, "s.retry", job)
        records += contend(app, rec, "s.park", f"{job}-park")
        unique_once(app, rec, f"{job}-unique")
    finally:
        for key in env:
            os.environ.pop(key, None)
    pids = [int(p) for p in rec.lrange(calls, 0, -1)]
    assert len(pids) == len(set(pids)), pids  # never twice in one process
    assert {r["pid"] for r in records} <= set(pids)  # every child that ran built its own
    assert worker.proc.pid in pids  # the main process (its start-up check)
    assert os.getpid() in pids  # the publishing side
    with redis.Redis.from_url(f"{redis_base}/5") as store:
        assert len(fences(store, job)) == 3  # retry, park, unique
    app.close()
