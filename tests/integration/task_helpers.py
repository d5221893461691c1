"""Helpers of the LockedTask integration tests: workers, recordings, interval checks."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import redis

from celery_redislock import config, keys
from tests.workers import Worker


def start_worker(
    redis_base: str,
    name: str,
    pool: str = "prefork",
    concurrency: int = 4,
    *,
    warm: Any = None,
    queue: Optional[str] = None,
    **kw: Any,
) -> Worker:
    """Start a worker and wait until it consumes; callers stop it."""
    worker = Worker(redis_base, concurrency=concurrency, pool=pool, name=name, **kw)
    try:
        worker.wait_ready()
        if warm is not None:
            warm_up(warm, concurrency, queue)
        return worker
    except BaseException:
        worker.stop()
        raise


def warm_up(capp: Any, concurrency: int, queue: Optional[str] = None) -> None:
    """Run locked tasks, and skip some, on every pool process first (imports, connections,
    script loads), so the first test's timings measure the library, not a cold start."""
    tag = uniq("warm")
    results = [
        capp.lt_fail.apply_async((uniq("warm"), tag, 0.2), queue=queue)
        for _ in range(2 * concurrency)
    ]
    job = uniq("warm")
    results += [
        capp.lt_skip.apply_async((job, tag, 0.3), queue=queue) for _ in range(2 * concurrency)
    ]
    for r in results:
        r.get(timeout=30, propagate=False)


def uniq(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def runs(rec: redis.Redis, tag: str) -> list[dict[str, Any]]:
    """What the bodies recorded under ``tag``, in recording order."""
    return [json.loads(x) for x in rec.lrange(f"runs:{tag}", 0, -1)]


def listed(rec: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in rec.lrange(key, 0, -1)]


def wait_until(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def wait_started(rec: redis.Redis, tag: str, count: int = 1, timeout: float = 10.0) -> list[Any]:
    """Wait until ``count`` bodies recorded under ``tag`` have started."""
    return wait_until(
        lambda: (
            [json.loads(x) for x in rec.lrange(f"started:{tag}", 0, -1)]
            if rec.llen(f"started:{tag}") >= count
            else None
        ),
        timeout,
        what=f"{count} start(s) of {tag}",
    )


def lock_key(task: Any, args: tuple[Any, ...] = (), kwargs: Optional[dict[str, Any]] = None) -> str:
    """The Redis key of the lock that ``task`` takes for these arguments."""
    name = task.lock_name_for(args, kwargs or {})
    return keys.lock_keys(config.settings_for(task.app).key_prefix, name).lock


def assert_no_overlap(records: list[dict[str, Any]]) -> None:
    """No two recorded bodies ran at the same time (intervals on CLOCK_MONOTONIC)."""
    ordered = sorted(records, key=lambda r: r["start"])
    for before, after in zip(ordered, ordered[1:]):
        assert after["start"] >= before["end"], (
            f"bodies overlap: {before['id']} ran {before['start']:.3f}..{before['end']:.3f}, "
            f"{after['id']} started at {after['start']:.3f}"
        )


def peak_concurrency(records: list[dict[str, Any]]) -> int:
    """The largest number of recorded bodies running at one instant."""
    events = sorted(
        [(r["start"], 1) for r in records] + [(r["end"], -1) for r in records],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def report(name: str, **values: Any) -> None:
    """Append a measurement to $REDISLOCK_MEASUREMENTS (JSON lines), if set."""
    path = os.environ.get("REDISLOCK_MEASUREMENTS")
    if path:
        with Path(path).open("a") as f:
            f.write(json.dumps({"name": name, **values}) + "\n")
