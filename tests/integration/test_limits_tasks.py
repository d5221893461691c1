"""Semaphores, concurrency groups and read-write locks on real prefork workers.

Two ``celery -A tests.limits_app worker -P prefork -c 4`` subprocesses serve
every test of this module; task bodies record their start and end (monotonic
clock) in Redis, and the assertions are about those measured intervals.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock import ConfigurationError, LockContended, LockedTask, TaskSkipped
from tests.helpers import intervals, overlapping, peak_overlap, report, utilisation
from tests.integration.task_helpers import (
    flush_state,
    limits_app,
    limits_workers,
    runs,
    uniq,
    wait_runs,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]


@pytest.fixture(scope="module")
def app(redis_url: str) -> Any:
    return limits_app(redis_url)


@pytest.fixture(scope="module")
def workers(redis_url: str, app: Any) -> Iterator[list[Worker]]:
    """Two prefork workers of four processes each, every process warmed up."""
    flush_state(redis_url)
    with limits_workers(redis_url, ["limits-a", "limits-b"]) as started:
        # Imports, connections and script loads happen here, not in a measurement.
        tag = uniq("warm")
        results = [app.signature("l.sem2_retry", (tag, 0.05, i)).apply_async() for i in range(16)]
        for result in results:
            result.get(timeout=30)
        yield started


def submit(app: Any, name: str, *args: Any, **options: Any) -> Any:
    return app.signature(name, args).apply_async(**options)


def settle(results: list[Any], timeout: float = 30) -> list[Any]:
    """Each result's value or exception, waiting at most ``timeout`` in all."""
    deadline = time.monotonic() + timeout
    return [r.get(timeout=max(0.1, deadline - time.monotonic()), propagate=False) for r in results]


def by_seq(records: list[dict[str, Any]]) -> Counter[int]:
    return Counter(r["seq"] for r in records)


# -- semaphore ------------------------------------------------------------------------


def test_semaphore_of_3_on_two_workers_peaks_at_3_and_stays_busy(
    app: Any, rec: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("sem3")
    results = [submit(app, "l.sem3", tag, 0.2, i) for i in range(30)]
    settle(results)
    records = wait_runs(rec, tag, 30, 5)
    spans = intervals(records)
    assert by_seq(records) == Counter(range(30))
    assert peak_overlap(spans) == 3
    assert len({r["pid"] for r in records}) >= 6  # both workers' processes took part
    busy = utilisation(spans, 3)
    assert busy >= 0.9
    fences = [r["fence"] for r in records]
    assert len(set(fences)) == 30
    report("task semaphore 3 x 30 x 0.2 s, 2 workers -c 4", peak=peak_overlap(spans), util=busy)


# l.per_customer is bind=True: its lock_key must skip `self` when binding.
@pytest.mark.parametrize("name", ["l.per_customer", "l.per_customer_plain"])
def test_semaphore_per_key_limits_each_customer_while_customers_run_in_parallel(
    app: Any, rec: redis.Redis, workers: list[Worker], name: str
) -> None:
    tag = uniq("customer")
    customers = ["acme", "globex", "initech"]
    results = [submit(app, name, customers[i % 3], tag, 0.3, i) for i in range(18)]
    settle(results)
    records = wait_runs(rec, tag, 18, 5)
    assert by_seq(records) == Counter(range(18))
    peaks = {
        customer: peak_overlap(intervals(r for r in records if r["customer"] == customer))
        for customer in customers
    }
    # A waiting run occupies a pool process, so not every customer need reach
    # its limit; none may pass it, and customers do not wait for each other.
    assert max(peaks.values()) == 2, peaks
    assert peak_overlap(intervals(records)) >= 4


def test_concurrency_group_is_shared_by_two_different_tasks(
    app: Any, rec: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("group")
    results = [submit(app, "l.pay_a" if i % 2 else "l.pay_b", tag, 0.2, i) for i in range(16)]
    settle(results)
    records = wait_runs(rec, tag, 16, 10)  # pay_b parks: its results are not the runs
    assert by_seq(records) == Counter(range(16))
    assert Counter(r["kind"] for r in records) == {"a": 8, "b": 8}
    # Alone, each task could reach 3: together they share one limit of 3.
    assert peak_overlap(intervals(records)) == 3
    a = [r for r in records if r["kind"] == "a"]
    b = [r for r in records if r["kind"] == "b"]
    assert any(overlapping((x["start"], x["end"]), (y["start"], y["end"])) for x in a for y in b)
    assert len({r["fence"] for r in records}) == 16  # one semaphore, one fence sequence


def test_unknown_concurrency_group_fails_at_definition_naming_task_and_group() -> None:
    app = Celery("groups", set_as_current=False)
    app.conf.redislock_semaphores = {"payments-api": 3, "search": 2}
    options: dict[str, Any] = {"base": LockedTask, "shared": False}

    @app.task(name="billing.charge", concurrency_group="paymnets-api", **options)
    def charge() -> None:  # pragma: no cover - never runs
        pass

    @app.task(name="billing.refund", concurrency_group="payments-api", **options)
    def refund() -> None:  # pragma: no cover - never runs
        pass

    with pytest.raises(ConfigurationError) as exc_info:
        app.finalize()
    message = str(exc_info.value)
    assert "'billing.charge'" in message
    assert "'paymnets-api'" in message
    assert "payments-api, search" in message  # what is configured

    good = Celery("groups-ok", set_as_current=False)
    good.conf.redislock_semaphores = {"payments-api": 3}

    @good.task(name="billing.refund", concurrency_group="payments-api", **options)
    def refund_ok() -> None:  # pragma: no cover - never runs
        pass

    good.finalize()
    assert good.tasks["billing.refund"].concurrency_group == "payments-api"


# -- read-write lock -------------------------------------------------------------------


def test_reader_tasks_overlap_and_writer_tasks_are_exclusive(
    app: Any, rec: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("rw")
    plan = "rrrwrrrwrwrrr"
    results = [
        submit(app, "l.read" if mode == "r" else "l.write", tag, 0.2, i)
        for i, mode in enumerate(plan)
    ]
    settle(results)
    records = wait_runs(rec, tag, len(plan), 5)
    assert by_seq(records) == Counter(range(len(plan)))
    writes = [r for r in records if r["mode"] == "w"]
    reads = [r for r in records if r["mode"] == "r"]
    assert len(writes) == plan.count("w")
    for w in writes:
        others = [x for x in records if x is not w]
        assert not [
            x for x in others if overlapping((w["start"], w["end"]), (x["start"], x["end"]))
        ]
    assert peak_overlap(intervals(reads)) >= 3


# -- contention policies on semaphores ---------------------------------------------------


@pytest.mark.parametrize(("policy", "error"), [("skip", TaskSkipped), ("fail", LockContended)])
def test_semaphore_contention_policy_ends_the_extra_runs_at_once(
    app: Any, rec: redis.Redis, workers: list[Worker], policy: str, error: type
) -> None:
    tag = uniq(policy)
    started = time.monotonic()
    results = [submit(app, f"l.sem2_{policy}", tag, 0.8, i) for i in range(6)]
    ended: dict[int, float] = {}
    values: dict[int, Any] = {}
    while len(ended) < 6 and time.monotonic() - started < 10:
        for i, r in enumerate(results):
            if i not in ended and r.ready():
                ended[i] = time.monotonic() - started
                values[i] = r.get(propagate=False)
        time.sleep(0.01)
    records = wait_runs(rec, tag, 2, 5)
    time.sleep(0.2)
    assert len(runs(rec, tag)) == 2  # exactly the limit ran
    assert peak_overlap(intervals(records)) == 2
    refused = {i: v for i, v in values.items() if isinstance(v, Exception)}
    assert len(refused) == 4
    assert all(isinstance(v, error) for v in refused.values()), refused
    assert all("semaphore 'l.sem2_" in str(v) for v in refused.values())
    # Refused while the two holders were still running, not after them.
    assert max(ended[i] for i in refused) < min(r["end"] for r in records) - started
    assert max(ended[i] for i in refused) < 0.6


@pytest.mark.parametrize(("name", "limit"), [("l.sem2_retry", 2), ("l.sem3_park", 3)])
def test_semaphore_with_retry_or_park_runs_everything_within_the_limit(
    app: Any, rec: redis.Redis, workers: list[Worker], name: str, limit: int
) -> None:
    tag = uniq(name)
    for i in range(12):
        submit(app, name, tag, 0.15, i)
    records = wait_runs(rec, tag, 12, 15)
    time.sleep(0.3)
    records = runs(rec, tag)
    assert by_seq(records) == Counter(range(12))  # each exactly once
    assert peak_overlap(intervals(records)) == limit


# -- a killed holder ---------------------------------------------------------------------


@pytest.mark.fault
def test_permit_of_a_task_whose_process_is_killed_is_freed_by_the_worker(
    app: Any, rec: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("killed")
    submit(app, "l.sem1_hang", tag, 30.0, 0)
    hang = wait_runs(rec, tag, 1, 10, key="started")[0]
    submit(app, "l.sem1", tag, 0.1, 1)
    time.sleep(0.3)  # the second run is waiting for the permit
    assert runs(rec, tag) == []
    os.kill(hang["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    waiter = wait_runs(rec, tag, 1, 10)[0]
    # Freed by the main process once it sees the child died (billiard notices a
    # lost child within a few seconds) and reaps the dead child's holds, not by
    # the lease (10 s, renewed) running out.
    assert waiter["start"] - killed_at < 6.0
