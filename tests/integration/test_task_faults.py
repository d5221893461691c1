"""Deaths the task body cannot see, and an unreachable lock store.

A hard time limit or ``revoke(terminate=True)`` kills the pool child; the
worker's main process must free the lock at once (not when the lease ends).
SIGKILL of the whole worker leaves nobody to free it: the lease (lock_ttl=2)
must end it.  Time-to-free is measured from the time limit / revoke / kill.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis
from billiard.exceptions import TimeLimitExceeded
from celery import Celery
from celery.exceptions import TaskRevokedError

from celery_redislock import BackendUnavailable, LockedTask
from tests.helpers import report
from tests.integration.task_helpers import (
    listed,
    lock_key,
    runs,
    start_worker,
    uniq,
    wait_started,
    worker_fixture,
)
from tests.redis_server import free_port
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.fault, pytest.mark.slow]


worker = worker_fixture("faults")


def time_to_free(locks: redis.Redis, key: str, since: float, limit: float) -> float:
    """Seconds from ``since`` (monotonic) until ``key`` was first seen gone.

    Fails once ``limit`` + 0.5 s have passed with the key still there, rather
    than waiting for the lease to end.
    """
    deadline = since + limit + 0.5
    while locks.exists(key):
        if time.monotonic() > deadline:
            raise AssertionError(f"{key} still held {deadline - since:.1f}s later")
        time.sleep(0.005)
    return time.monotonic() - since


#: How the killed body reacts: a sleeping body gets SIGTERM, raises SystemExit
#: in the child (billiard's handler) and its own ``finally`` frees the lock; a
#: body that blocks SIGTERM is SIGKILLed, and the worker's main process must
#: free it (celery_redislock.request).
BODIES = ["lt_fail", "lt_stubborn"]


@pytest.mark.parametrize("body", BODIES)
def test_hard_time_limit_frees_the_lock_at_once(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis, body: str
) -> None:
    task = getattr(capp, body)
    tag, job = uniq("hardlimit"), uniq("job")
    key = lock_key(task, (job, tag))
    result = task.apply_async((job, tag, 10.0), time_limit=1)
    (started,) = wait_started(rec, tag)
    assert locks.exists(key)
    limit_at = started["start"] + 1.0  # the limit counts from before the body started
    freed = time_to_free(locks, key, limit_at, 1.0)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=5)
    report("hard_time_limit", body=body, time_to_free_s=freed)
    assert freed <= 1.0, f"lock freed {freed:.2f}s after the hard time limit"
    assert runs(rec, tag) == []  # the body never finished


@pytest.mark.parametrize(
    ("body", "signal"),
    [
        ("lt_fail", "SIGTERM"),
        ("lt_fail", "SIGKILL"),
    ],
)
def test_revoke_terminate_frees_the_lock_at_once(
    worker: Worker,
    capp: ModuleType,
    rec: redis.Redis,
    locks: redis.Redis,
    body: str,
    signal: str,
) -> None:
    task = getattr(capp, body)
    tag, job = uniq("revoke"), uniq("job")
    key = lock_key(task, (job, tag))
    result = task.delay(job, tag, 10.0)
    wait_started(rec, tag)
    assert locks.exists(key)
    t0 = time.monotonic()
    capp.app.control.revoke(result.id, terminate=True, signal=signal)
    freed = time_to_free(locks, key, t0, 1.0)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=5)
    report("revoke_terminate", body=body, signal=signal, time_to_free_s=freed)
    assert freed <= 1.0, f"lock freed {freed:.2f}s after revoke(terminate=True)"
    assert runs(rec, tag) == []
    # The next run of the same key gets the lock (fail policy: it would raise otherwise).
    assert task.delay(job, tag, 0.0).get(timeout=5)["fence"] is not None


def test_sigkill_of_the_whole_worker_frees_the_lock_within_its_lease(
    redis_base: str, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    queue = uniq("killq")
    doomed = start_worker(redis_base, "doomed", concurrency=1, extra=["-Q", queue])
    try:
        tag, job = uniq("sigkill"), uniq("job")
        key = lock_key(capp.lt_ttl2, (job, tag))
        capp.lt_ttl2.apply_async((job, tag, 30.0), queue=queue)
        wait_started(rec, tag)
        time.sleep(1.0)  # at least one renewal went through: the lease is ~2 s from now
        assert locks.exists(key)
        t0 = time.monotonic()
        doomed.kill()
        doomed.proc.wait(5)
        freed = time_to_free(locks, key, t0, 2.0 + 1.0)
    finally:
        doomed.stop()
    report("sigkill_worker", lock_ttl_s=2.0, time_to_free_s=freed)
    assert freed <= 2.0 + 1.0, f"lock freed {freed:.2f}s after SIGKILL (lock_ttl=2)"


def test_worker_retries_while_the_lock_store_is_unreachable(
    redis_base: str, capp: ModuleType, rec: redis.Redis
) -> None:
    """lock_on_redis_error="retry" (the default): re-sent with backoff,
    lock_redis_error_retries times, then FAILURE with BackendUnavailable; the
    body never runs.  Counted apart from contention retries: lt.retry_max's
    lock_retry_max=2 does not cut it short."""
    queue = uniq("deadq")
    dead = f"redis://127.0.0.1:{free_port()}/0"
    w = start_worker(
        redis_base,
        "deadstore",
        concurrency=1,
        extra=["-Q", queue],
        env={"REDISLOCK_TEST_LOCK_URL": dead},
    )
    try:
        tag, job = uniq("dead"), uniq("job")
        result = capp.lt_retry_max.apply_async(
            (job, tag, 0.0), queue=queue, redislock={"lock_redis_error_retries": 3}
        )
        with pytest.raises(BackendUnavailable) as info:
            result.get(timeout=20)
        log = w.output()
    finally:
        w.stop()
    assert "unreachable after 3 re-sends (lock_redis_error_retries=3)" in str(info.value)
    assert runs(rec, tag) == []
    retries = [s for s in listed(rec, "retry_signals") if s["id"] == result.id]
    assert len(retries) == 3, retries
    assert all(r["reason"].startswith("lock store unreachable, retry") for r in retries), retries
    assert f"{result.id}]: lock store unreachable" in log
    assert "lock contended" not in log  # Celery's retry line says what happened


# -- lock store unreachable, eager: each lock_on_redis_error policy ----------------


@pytest.fixture
def dead_store_app() -> Iterator[Celery]:
    app = Celery("dead-store", set_as_current=False)
    app.conf.update(
        redislock_url=f"redis://127.0.0.1:{free_port()}/0",
        redislock_socket_timeout=1.0,
    )
    yield app
    app.close()


@pytest.mark.parametrize("policy", ["fail", "run", "retry"])
def test_unreachable_lock_store_policies_when_eager(dead_store_app: Celery, policy: str) -> None:
    ran: list[Any] = []

    @dead_store_app.task(
        name=f"dead.{policy}",
        base=LockedTask,
        lock_on_redis_error=policy,
        lock_key=["k"],
        shared=False,
    )
    def task(k: str) -> Any:
        ran.append(getattr(task.request, "lock_fence", None))
        return "ran"

    t0 = time.monotonic()
    result = task.apply(("x",))
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0, elapsed  # refused connections fail fast
    if policy == "run":
        # Runs without a lock: no fence.
        assert result.successful() and result.result == "ran"
        assert ran == [None]
    else:
        # "fail", and "retry" when eager (no broker to re-send to): FAILURE, body not run.
        assert result.state == "FAILURE"
        assert isinstance(result.result, BackendUnavailable)
        assert "unreachable" in str(result.result).lower()
        assert ran == []


def test_unreachable_lock_store_with_task_always_eager(dead_store_app: Celery) -> None:
    dead_store_app.conf.task_always_eager = True

    @dead_store_app.task(
        name="dead.eager", base=LockedTask, lock_on_redis_error="fail", shared=False
    )
    def task() -> str:
        return "ran"

    result = task.delay()
    assert result.state == "FAILURE" and isinstance(result.result, BackendUnavailable)
    dead_store_app.conf.task_eager_propagates = True
    with pytest.raises(BackendUnavailable):
        task.delay()
