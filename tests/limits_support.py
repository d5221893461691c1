"""Helpers of the semaphore, read-write lock and park tests (tests/integration).

Bodies of tests.limits_app record ``{start, end, fence, seq, ...}`` into the
list ``runs:<tag>`` on db 3; start and end come from time.monotonic(), which
on Linux is CLOCK_MONOTONIC and so comparable across the processes of one
machine (workers, forked children and the test process alike).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import redis

from tests.workers import Worker

Interval = tuple[float, float]


# -- processes -------------------------------------------------------------------


@contextlib.contextmanager
def forking() -> Iterator[None]:
    # Python 3.12+ warns about fork() in a process with threads (the keeper's);
    # the children here only run code that is fork-safe by design (see renewal.py).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*fork.*", DeprecationWarning)
        yield


def fork_context() -> Any:
    return multiprocessing.get_context("fork")


def base_of(redis_url: str) -> str:
    """``redis://host:port`` of a ``redis://host:port/0`` URL."""
    return redis_url.rsplit("/", 1)[0]


@contextlib.contextmanager
def limits_workers(
    redis_url: str,
    names: Iterable[str],
    concurrency: int = 4,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
) -> Iterator[list[Worker]]:
    """Start ``celery -A tests.limits_app worker`` subprocesses; stop them on exit."""
    base = base_of(redis_url)
    started = [
        Worker(
            base,
            app="tests.limits_app",
            name=f"{name}-{os.getpid()}",
            concurrency=concurrency,
            env=env,
            extra=extra,
        )
        for name in names
    ]
    try:
        for w in started:
            w.wait_ready()
        yield started
    finally:
        stop_all(started)


def stop_all(workers: Iterable[Worker]) -> None:
    """Stop workers in parallel: a warm shutdown takes a while each."""
    workers = list(workers)
    for w in workers:
        if w.proc.poll() is None:
            w.proc.terminate()
    for w in workers:
        w.stop()


def limits_app(redis_url: str) -> Any:
    """tests.limits_app's app in this process, pointed at the test's redis-server."""
    from celery_redislock import config
    from tests import limits_app as module

    base = base_of(redis_url)
    app = module.app
    if app.conf.broker_url != f"{base}/1":
        app.conf.update(
            broker_url=f"{base}/1", result_backend=f"{base}/2", redislock_url=f"{base}/0"
        )
        config.reset(app)
    return app


def flush_state(redis_url: str) -> None:
    """Forget every lock (db 0) and recording (db 3); the broker (db 1) keeps its bindings."""
    base = base_of(redis_url)
    for db in (0, 3):
        client = redis.Redis.from_url(f"{base}/{db}")
        client.flushdb()
        client.close()


def new_tag(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


# -- recordings ------------------------------------------------------------------


def runs(rec: redis.Redis, tag: str) -> list[dict[str, Any]]:
    """The recorded runs of ``tag``, in the order they ended."""
    return [json.loads(x) for x in rec.lrange(f"runs:{tag}", 0, -1)]


def wait_runs(
    rec: redis.Redis, tag: str, n: int, timeout: float, key: str = "runs"
) -> list[dict[str, Any]]:
    """Poll until ``n`` runs of ``tag`` are recorded; fail with what was seen."""
    deadline = time.monotonic() + timeout
    while rec.llen(f"{key}:{tag}") < n:
        if time.monotonic() > deadline:
            seen = [json.loads(x) for x in rec.lrange(f"{key}:{tag}", 0, -1)]
            raise AssertionError(f"{len(seen)} of {n} runs of {tag} after {timeout} s: {seen}")
        time.sleep(0.02)
    return [json.loads(x) for x in rec.lrange(f"{key}:{tag}", 0, -1)]


def intervals(records: Iterable[dict[str, Any]]) -> list[Interval]:
    return [(r["start"], r["end"]) for r in records]


def peak_overlap(spans: Iterable[Interval]) -> int:
    """The largest number of intervals open at one instant (touching ones do not overlap)."""
    spans = list(spans)
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = current = 0
    for _, step in events:  # an end sorts before a start at the same instant
        current += step
        peak = max(peak, current)
    return peak


def overlapping(a: Interval, b: Interval) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def utilisation(spans: list[Interval], limit: int) -> float:
    """Busy time over ``limit`` x the wall time from the first start to the last end."""
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return sum(e - s for s, e in spans) / (limit * wall)


def report(label: str, **values: Any) -> None:
    """Print a measurement (shown with ``pytest -s``; kept for the issue notes)."""
    shown = ", ".join(
        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
    print(f"\n[measure] {label}: {shown}")
