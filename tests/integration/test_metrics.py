"""Prometheus metrics of a real prefork worker, scraped from its endpoint.

The worker (tests.metrics_app, three pool processes) serves
``redislock_metrics_port`` from its main process, in prometheus_client's
multiprocess mode (a PROMETHEUS_MULTIPROC_DIR under tmp_path); its pool
processes record.  A known workload runs (acquires, runs skipped behind a
held lock, semaphore and read-write lock, runs parked and re-published, a
duplicate refused at publish, a lease lost, a run over its rate limit) and
the scrape must show exactly those counts, with histogram counts matching the runs that acquired and
released.
"""

from __future__ import annotations

import importlib
import os
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from celery_redislock.exceptions import RateLimited, TaskSkipped
from tests.helpers import wait_until
from tests.integration.task_helpers import start_worker, uniq, wait_runs
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> Samples:
    """Every celery_redislock sample on the endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("celery_redislock_")
    }


def counters(samples: Samples) -> Samples:
    return {k: v for k, v in samples.items() if k[0].endswith("_total")}


def labels(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))


@pytest.fixture(scope="module")
def mapp(redis_base: str) -> ModuleType:
    """tests.metrics_app, pointed at the session's Redis, as the client side."""
    module = importlib.import_module("tests.metrics_app")
    module.configure(redis_base)
    return module


@pytest.fixture(scope="module")
def multiproc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prometheus-multiproc")


@pytest.fixture(scope="module")
def worker(redis_base: str, mapp: ModuleType, multiproc: Path) -> Iterator[tuple[Worker, int]]:
    port = free_port()
    env = {
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        "REDISLOCK_TEST_METRICS_PORT": str(port),
    }
    w = start_worker(
        redis_base, f"metrics-{os.getpid()}", concurrency=3, app="tests.metrics_app", env=env
    )
    yield w, port
    w.stop()


def test_a_prefork_worker_serves_exact_counts_of_a_known_workload(
    worker: tuple[Worker, int], mapp: ModuleType, rec: redis.Redis, multiproc: Path
) -> None:
    w, port = worker
    assert f"celery_redislock: metrics on http://127.0.0.1:{port}/metrics" in w.output()
    assert f"PROMETHEUS_MULTIPROC_DIR={multiproc}" in w.output()
    assert counters(scrape(port)) == {}

    # A rate limit of one start a minute: the second run fails, counted.
    tag = uniq("rate")
    assert mapp.rate.delay(tag).get(timeout=10) == tag
    with pytest.raises(RateLimited):
        mapp.rate.delay(tag).get(timeout=10)

    # A lease lost while held, reported by renewal and again by the release
    # (first: that release is settled long before the scrape).
    tag = uniq("lost")
    mapp.lose.delay("L", tag).get(timeout=10)

    # A lock held; three runs skipped behind it.
    tag = uniq("skip")
    holder = mapp.lock.delay("A", tag, 1.5)
    wait_runs(rec, tag, 1, 10, key="started")
    skipped = [mapp.lock.delay("A", tag, 0.0) for _ in range(3)]
    for r in skipped:
        with pytest.raises(TaskSkipped):
            r.get(timeout=10)
    holder.get(timeout=10)

    # A lock held; two runs parked behind it, each re-published when granted.
    tag = uniq("park")
    holder = mapp.park.delay("P", tag, 1.0)
    wait_runs(rec, tag, 1, 10, key="started")
    parked = [mapp.park.delay("P", tag, 0.2) for _ in range(2)]
    for r in [holder, *parked]:
        r.get(timeout=20)

    # A semaphore of two, both permits held: one run skipped.
    tag = uniq("sem")
    holders = [mapp.sem.delay("S", tag, 1.0) for _ in range(2)]
    wait_runs(rec, tag, 2, 10, key="started")
    with pytest.raises(TaskSkipped):
        mapp.sem.delay("S", tag, 0.0).get(timeout=10)
    for r in holders:
        r.get(timeout=10)

    # Two readers at once; a writer skipped while they read.
    tag = uniq("rw")
    readers = [mapp.read.delay("R", tag, 1.0) for _ in range(2)]
    wait_runs(rec, tag, 2, 10, key="started")
    with pytest.raises(TaskSkipped):
        mapp.write.delay("R", tag, 0.0).get(timeout=10)
    for r in readers:
        r.get(timeout=10)

    # A unique job published twice inside the worker: the second is refused.
    tag = uniq("unique")
    first, second = mapp.publish_twice.delay("U", tag).get(timeout=10)
    assert second == first
    mapp.unique.AsyncResult(first).get(timeout=10)

    lock = {"kind": "lock"}
    expected = {
        ("celery_redislock_acquired_total", labels(task="m.lock", **lock)): 1.0,
        ("celery_redislock_contended_total", labels(task="m.lock", policy="skip", **lock)): 3.0,
        ("celery_redislock_skipped_total", labels(task="m.lock", **lock)): 3.0,
        ("celery_redislock_acquired_total", labels(task="m.park", **lock)): 3.0,
        ("celery_redislock_contended_total", labels(task="m.park", policy="park", **lock)): 2.0,
        ("celery_redislock_parked_total", labels(task="m.park", **lock)): 2.0,
        ("celery_redislock_republished_total", labels(task="m.park", **lock)): 2.0,
        ("celery_redislock_acquired_total", labels(task="m.sem", kind="semaphore")): 2.0,
        (
            "celery_redislock_contended_total",
            labels(task="m.sem", kind="semaphore", policy="skip"),
        ): 1.0,
        ("celery_redislock_skipped_total", labels(task="m.sem", kind="semaphore")): 1.0,
        ("celery_redislock_acquired_total", labels(task="m.read", kind="rwlock")): 2.0,
        (
            "celery_redislock_contended_total",
            labels(task="m.write", kind="rwlock", policy="skip"),
        ): 1.0,
        ("celery_redislock_skipped_total", labels(task="m.write", kind="rwlock")): 1.0,
        ("celery_redislock_duplicates_total", labels(task="m.unique", action="return")): 1.0,
        ("celery_redislock_acquired_total", labels(task="m.unique", **lock)): 1.0,
        ("celery_redislock_acquired_total", labels(task="m.lose", **lock)): 1.0,
        ("celery_redislock_lost_total", labels(task="m.lose", **lock)): 1.0,
        ("celery_redislock_rate_limited_total", labels(task="m.rate", policy="fail")): 1.0,
    }
    acquired = {k[1]: v for k, v in expected.items() if k[0] == "celery_redislock_acquired_total"}
    released = {k: v for k, v in acquired.items() if dict(k)["task"] != "m.lose"}

    def histogram(samples: Samples, name: str, suffix: str) -> dict[Any, float]:
        return {
            tuple(kv for kv in k[1] if kv[0] != "le"): v
            for k, v in samples.items()
            if k[0] == f"{name}_{suffix}" and dict(k[1]).get("le", "+Inf") == "+Inf"
        }

    # A release is settled after its run's result is stored: wait for the
    # last ones, then every figure must be exactly as counted.
    def settled() -> Any:
        s = scrape(port)
        return s if histogram(s, "celery_redislock_hold_seconds", "count") == released else None

    samples = wait_until(settled, timeout=10, interval=0.1, what="the releases counted")
    assert counters(samples) == expected
    assert histogram(samples, "celery_redislock_wait_seconds", "count") == acquired
    assert histogram(samples, "celery_redislock_wait_seconds", "bucket") == acquired
    assert histogram(samples, "celery_redislock_hold_seconds", "bucket") == released

    # Measured durations: each parked run waited for the holder (1.0 s from
    # just before they were published) and the one parked behind it too; each
    # run held its lock for at least its body's sleep.
    wait_sum = histogram(samples, "celery_redislock_wait_seconds", "sum")
    hold_sum = histogram(samples, "celery_redislock_hold_seconds", "sum")
    assert 1.5 <= wait_sum[labels(task="m.park", **lock)] < 10
    assert wait_sum[labels(task="m.lock", **lock)] < 0.5
    assert 1.4 <= hold_sum[labels(task="m.park", **lock)] < 10
    assert 1.5 <= hold_sum[labels(task="m.lock", **lock)] < 5
    assert 2.0 <= hold_sum[labels(task="m.read", kind="rwlock")] < 5

    # Recorded by more than one pool process, summed by the main process.
    pids = {p.stem.rsplit("_", 1)[1] for p in multiproc.glob("*.db")}
    assert len(pids) >= 2, sorted(p.name for p in multiproc.glob("*.db"))
    assert str(w.proc.pid) not in pids  # the main process only serves
    assert "Signal handler" not in w.output()


def test_without_a_multiprocess_dir_a_prefork_worker_refuses_to_start(
    redis_base: str, mapp: ModuleType
) -> None:
    env = {"REDISLOCK_TEST_METRICS_PORT": str(free_port())}
    w = Worker(
        redis_base,
        concurrency=1,
        name=f"metrics-nodir-{os.getpid()}",
        app="tests.metrics_app",
        env=env,
    )
    try:
        wait_until(lambda: w.proc.poll() is not None, 30, what="the worker to exit")
        out = w.output()
    finally:
        w.stop()
    assert w.proc.returncode != 0
    assert "ConfigurationError: redislock_metrics_port=" in out, out
    assert "with the prefork pool needs PROMETHEUS_MULTIPROC_DIR" in out, out
    assert " ready." not in out


def test_a_bad_port_stops_the_worker_naming_the_setting_and_value(
    redis_base: str, mapp: ModuleType, tmp_path: Path
) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "REDISLOCK_TEST_METRICS_PORT": "http"}
    w = Worker(
        redis_base,
        concurrency=1,
        name=f"metrics-bad-{os.getpid()}",
        app="tests.metrics_app",
        env=env,
    )
    try:
        wait_until(lambda: w.proc.poll() is not None, 30, what="the worker to exit")
        out = w.output()
    finally:
        w.stop()
    assert w.proc.returncode != 0
    assert (
        "ConfigurationError: redislock_metrics_port must be None or an int >= 0, got 'http'" in out
    ), out
    assert " ready." not in out


def test_a_threads_worker_serves_its_own_process_metrics(
    redis_base: str, mapp: ModuleType, rec: redis.Redis
) -> None:
    port = free_port()
    env = {"REDISLOCK_TEST_METRICS_PORT": str(port)}
    w = start_worker(
        redis_base,
        f"metrics-threads-{os.getpid()}",
        pool="threads",
        concurrency=2,
        app="tests.metrics_app",
        env=env,
        extra=["-Q", "metrics-threads"],  # not the prefork worker's queue
    )
    try:
        tag = uniq("threads")
        mapp.lock.apply_async(("T", tag, 0.0), queue="metrics-threads").get(timeout=10)

        def acquired() -> Any:
            s = scrape(port)
            key = ("celery_redislock_acquired_total", labels(task="m.lock", kind="lock"))
            return s if key in s else None

        samples = wait_until(acquired, timeout=10, interval=0.1, what="the acquire counted")
        assert counters(samples) == {
            ("celery_redislock_acquired_total", labels(task="m.lock", kind="lock")): 1.0
        }
        # The default registry: the process's own collectors come along.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"process_cpu_seconds_total" in response.read()
    finally:
        w.stop()


def test_a_port_in_use_stops_the_worker(redis_base: str, mapp: ModuleType, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "REDISLOCK_TEST_METRICS_PORT": str(port)}
        w = Worker(
            redis_base,
            concurrency=1,
            name=f"metrics-taken-{os.getpid()}",
            app="tests.metrics_app",
            env=env,
        )
        try:
            wait_until(lambda: w.proc.poll() is not None, 30, what="the worker to exit")
            out = w.output()
        finally:
            w.stop()
    assert w.proc.returncode != 0
    assert f"metrics endpoint: cannot listen on 127.0.0.1:{port}" in out, out
    assert " ready." not in out
