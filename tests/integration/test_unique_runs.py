"""A unique job's key across its run, on real prefork workers: retries, requeues,
revokes, time limits, dead workers.

A duplicate published at the right moment shows who holds the key: it gets
the holder's task id back (``on_duplicate="return"``), or a new one when the
key is free.
"""

from __future__ import annotations

import time
from types import ModuleType

import pytest
import redis
from celery.exceptions import MaxRetriesExceededError
from kombu import Connection

from celery_redislock import LockContended
from tests.helpers import wait_until
from tests.integration.task_helpers import (
    held,
    runs,
    start_worker,
    uniq,
    wait_runs,
    wait_started,
    worker_fixture,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]


worker = worker_fixture("uruns", app="tests.unique_app")


def free(task: object, *args: object) -> bool:
    return task.unique_holder(*args) is None  # type: ignore[attr-defined]


def test_self_retry_keeps_the_key_for_the_same_job(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("retry"), uniq("retry")
    first = uapp.retrying.delay(job, tag, 1.0)
    wait_runs(rec, tag, 1, 10)  # the first run has ended in retry()
    time.sleep(0.2)
    # Between the runs the job waits for its retry: a duplicate is its own job.
    assert uapp.retrying.delay(job, tag, 1.0).id == first.id
    first.get(timeout=10)
    ran = runs(rec, tag)
    assert [r["id"] for r in ran] == [first.id, first.id]
    assert [r["retries"] for r in ran] == [0, 1]
    wait_until(lambda: free(uapp.retrying, job, tag), 5, what="the key to go")


def test_a_retry_that_is_not_sent_ends_the_job_and_its_key(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("maxr"), uniq("maxr")
    # max_retries=0: retry() sends nothing and raises instead.
    result = uapp.retrying.apply_async((job, tag, 0.2, 1, 0))
    with pytest.raises(MaxRetriesExceededError):
        result.get(timeout=10)
    wait_until(lambda: free(uapp.retrying, job, tag), 5, what="the key to go")


def test_contention_retries_keep_the_key_for_the_same_job(
    worker: Worker, uapp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    job, tag = uniq("cont"), uniq("cont")
    with held(locks, uapp.finished, (job, tag)):
        result = uapp.finished.delay(job, tag, 0.0)
        wait_until(
            lambda: "lock contended, retry 2" in worker.output(), 10, what="two contention retries"
        )
        assert uapp.finished.delay(job, tag, 0.0).id == result.id
    result.get(timeout=10)
    assert [r["id"] for r in runs(rec, tag)] == [result.id]
    wait_until(lambda: free(uapp.finished, job, tag), 5, what="the key to go")


def test_a_per_call_unique_job_keeps_its_key_through_contention_retries(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    """lt.retry is no unique job; one call makes it one, for its retries too."""
    job, tag = uniq("pcall"), uniq("pcall")
    options = {"redislock": {"unique": "until_finished"}}
    with held(locks, capp.lt_retry, (job, tag)):
        result = capp.lt_retry.apply_async((job, tag, 0.0), **options)
        wait_until(
            lambda: f"{result.id}]: lock" in worker.output() and "retry 2" in worker.output(),
            10,
            what="two contention retries",
        )
        assert capp.lt_retry.apply_async((job, tag, 0.0), **options).id == result.id
        assert capp.lt_retry.apply_async((job, tag, 0.0)).id != result.id  # not unique
    result.get(timeout=10)
    assert result.id in [r["id"] for r in runs(rec, tag)]


def test_a_rejected_message_put_back_keeps_its_key(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("rej"), uniq("rej")
    first = uapp.requeue.delay(job, tag)
    ran = wait_runs(rec, tag, 2, 15)
    assert [r["id"] for r in ran] == [first.id, first.id]
    first.get(timeout=10)
    wait_until(lambda: free(uapp.requeue, job, tag), 5, what="the key to go")


def test_a_skipped_or_failed_run_ends_its_job_and_frees_its_key(
    worker: Worker, uapp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    job, tag = uniq("skip"), uniq("skip")
    with held(locks, uapp.finished, (job, tag)):
        for policy in ("skip", "fail"):
            result = uapp.finished.apply_async((job, tag, 0.0), redislock={"on_contention": policy})
            with pytest.raises(LockContended):  # TaskSkipped is one too
                result.get(timeout=10)
            assert free(uapp.finished, job, tag), policy
    assert runs(rec, tag) == []


def test_revoking_a_queued_job_frees_its_key_when_the_worker_discards_it(
    worker: Worker, uapp: ModuleType, capp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("rev"), uniq("rev")
    first = uapp.finished.apply_async((job, tag, 0.0), countdown=1.5)
    time.sleep(0.3)  # the worker has it, waiting for its ETA
    capp.app.control.revoke(first.id)
    assert uapp.finished.delay(job, tag, 0.0).id == first.id  # still queued
    wait_until(lambda: free(uapp.finished, job, tag), 5, what="the discarded job's key to go")
    again = uapp.finished.delay(job, tag, 0.0)
    assert again.id != first.id
    again.get(timeout=10)
    assert [r["id"] for r in runs(rec, tag)] == [again.id]


def test_a_hard_time_limit_frees_the_running_job_s_key_at_once(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("stuck"), uniq("stuck")
    result = uapp.stuck.delay(job, tag, 10.0)
    wait_until(lambda: rec.llen(f"runs:{tag}") == 1, 10, what="the run to start")
    started = time.monotonic()
    assert uapp.stuck.delay(job, tag).id == result.id  # running
    wait_until(lambda: free(uapp.stuck, job, tag), 5, 0.01, "the key to go")
    # The time limit is 1 s; the key went with the kill, not 30 s later with the lease.
    assert time.monotonic() - started < 3.0


def test_renewal_keeps_the_key_of_a_run_longer_than_its_lease(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("long"), uniq("long")
    result = uapp.short_lease.delay(job, tag, 2.5)  # lock_ttl=1
    wait_started(rec, tag)
    time.sleep(1.8)
    assert uapp.short_lease.delay(job, tag, 0.0).id == result.id
    result.get(timeout=10)


@pytest.mark.fault
def test_a_killed_worker_s_key_frees_with_its_lease(
    redis_base: str, capp: ModuleType, uapp: ModuleType, rec: redis.Redis
) -> None:
    """Without acks_late the message is gone with the worker: so is its key,
    once the run's lease runs out (1 s), not after unique_ttl (an hour)."""
    queue = uniq("ukill")
    w = start_worker(
        redis_base, "ukill", app="tests.unique_app", concurrency=1, extra=["-Q", queue]
    )
    try:
        job, tag = uniq("kill"), uniq("kill")
        first = uapp.short_lease.apply_async((job, tag, 10.0), queue=queue)
        wait_started(rec, tag)
        w.kill()
        killed = time.monotonic()
        assert uapp.short_lease.delay(job, tag, 0.0).id == first.id
        wait_until(lambda: free(uapp.short_lease, job, tag), 5, 0.02, "the dead run's key to go")
        assert time.monotonic() - killed < 2.5
    finally:
        w.stop()


@pytest.mark.fault
def test_a_killed_acks_late_worker_s_job_keeps_its_key_and_runs_again(
    redis_base: str, capp: ModuleType, uapp: ModuleType, rec: redis.Redis
) -> None:
    """acks_late: the message goes back to the queue with the worker's death,
    and its job keeps its key until it runs (not just its 1.5 s lease)."""
    job, tag, queue = uniq("late"), uniq("late"), uniq("ulate")
    options = {"app": "tests.unique_app", "concurrency": 1, "extra": ["-Q", queue]}
    first_worker = start_worker(redis_base, "ulate1", **options)
    try:
        first = uapp.late.apply_async((job, tag, 2.0), queue=queue)
        wait_started(rec, tag)
        first_worker.kill()
        time.sleep(2.0)  # the dead run's lease is gone
        assert uapp.late.delay(job, tag, 0.0).id == first.id
    finally:
        first_worker.stop()
    # The broker puts the unacknowledged message back once its visibility
    # timeout passes (kombu's scan; done here at once, whatever its cadence).
    with Connection(f"{redis_base}/1", transport_options={"visibility_timeout": 1}) as conn:
        conn.default_channel.qos.restore_visible(num=100)
    second_worker = start_worker(redis_base, "ulate2", **options)
    try:
        first.get(timeout=30)
        ran = runs(rec, tag)
        assert [r["id"] for r in ran] == [first.id]  # ended once, by the redelivery
        assert rec.llen(f"started:{tag}") == 2
        wait_until(lambda: free(uapp.late, job, tag), 5, what="the key to go")
    finally:
        second_worker.stop()
