"""Helpers of the worker tests: starting workers, pointing apps at the test Redis, recordings.

Two apps serve them: ``tests.celery_app`` (the LockedTask tests, test_task_*.py)
and ``tests.limits_app`` (semaphores, read-write locks, park).  Both use the
same layout: locks on db 0, broker db 1, results db 2, recordings db 3, where
bodies record ``{id, start, end, ...}`` into the lists ``started:<tag>`` and
``runs:<tag>`` (start and end from time.monotonic(): see tests.helpers).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any, Optional

import pytest
import redis

from celery_redislock import config
from celery_redislock.primitives import Lock, keys
from tests.helpers import wait_until
from tests.workers import Worker

# -- workers ---------------------------------------------------------------------


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


def worker_fixture(name: str, **kw: Any) -> Any:
    """A module-scoped ``worker`` fixture: a warmed-up tests.celery_app worker named ``name``.

    ``kw`` goes to :func:`start_worker` (``extra=["-Q", ...]`` and the like).
    """

    @pytest.fixture(scope="module")
    def worker(redis_base: str, capp: ModuleType) -> Iterator[Worker]:
        w = start_worker(redis_base, name, warm=capp, **kw)
        yield w
        w.stop()

    return worker


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
    # Every one ready before any get(): Celery 5.3's Redis backend spends a
    # second in each get() of a result that arrived while it waited for another.
    wait_until(lambda: all(r.ready() for r in results), 30, 0.02, "the warm-up runs")
    for r in results:
        r.get(timeout=30, propagate=False)


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
    from tests import limits_app as module

    return pointed(module.app, redis_url)


def pointed(app: Any, redis_url: str) -> Any:
    """``app`` (one of the tests' apps) pointed at the test's redis-server:
    broker db 1, results db 2, locks db 0."""
    base = base_of(redis_url)
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


# -- recordings ------------------------------------------------------------------


def collect(results: list[Any], timeout: float = 60.0) -> tuple[list[Any], list[BaseException]]:
    """get() every result; return (values, exceptions)."""
    values, errors = [], []
    for r in results:
        try:
            values.append(r.get(timeout=timeout))
        except Exception as exc:
            errors.append(exc)
    return values, errors


def uniq(prefix: str = "t") -> str:
    """A tag or job key of this test alone."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def listed(rec: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in rec.lrange(key, 0, -1)]


def runs(rec: redis.Redis, tag: str) -> list[dict[str, Any]]:
    """What the bodies recorded under ``tag``, in the order they ended."""
    return listed(rec, f"runs:{tag}")


def wait_runs(
    rec: redis.Redis, tag: str, n: int, timeout: float, key: str = "runs"
) -> list[dict[str, Any]]:
    """Poll until ``n`` runs of ``tag`` are recorded; fail with what was seen."""
    deadline = time.monotonic() + timeout
    while rec.llen(f"{key}:{tag}") < n:
        if time.monotonic() > deadline:
            seen = listed(rec, f"{key}:{tag}")
            raise AssertionError(f"{len(seen)} of {n} {key} of {tag} after {timeout} s: {seen}")
        time.sleep(0.01)
    return listed(rec, f"{key}:{tag}")


def postruns(
    rec: redis.Redis, task_id: str, count: int = 1, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """Wait for ``count`` task_postrun records of ``task_id`` (tests.celery_app's
    POSTRUN_TASKS record one per run, with the state and the lock's holder then)."""
    return wait_until(
        lambda: p if len(p := listed(rec, f"postrun:{task_id}")) >= count else None,
        timeout=timeout,
        what=f"{count} task_postrun record(s) of {task_id}",
    )


def wait_started(rec: redis.Redis, tag: str, count: int = 1, timeout: float = 10.0) -> list[Any]:
    """Wait until ``count`` bodies recorded under ``tag`` have started."""
    return wait_runs(rec, tag, count, timeout, key="started")


def lock_key(task: Any, args: tuple[Any, ...] = (), kwargs: Optional[dict[str, Any]] = None) -> str:
    """The Redis key of the lock that ``task`` takes for these arguments."""
    name = task.lock_name_for(args, kwargs or {})
    return keys.lock_keys(config.settings_for(task.app).key_prefix, name).lock


@contextlib.contextmanager
def held(
    locks: redis.Redis, task: Any, args: tuple[Any, ...], on_handoff: Any = None
) -> Iterator[Lock]:
    """The lock ``task`` takes for ``args``, held by the test meanwhile; its
    release hands over as a task's would when given ``on_handoff``."""
    lock = Lock(locks, task.lock_name_for(args, {}), ttl=30)
    lock.on_handoff = on_handoff
    assert lock.acquire(blocking=False)
    try:
        yield lock
    finally:
        lock.release()
