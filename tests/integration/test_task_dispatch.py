"""Every way of sending a LockedTask takes the lock, and contention retries keep the message.

A real prefork worker (-c 4) consuming the default queue and ``alt``; eager
paths (``apply()``, ``task_always_eager``) run in this process against the
same lock store; a direct call ``task(...)`` bypasses the lock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group

from celery_redislock import Lock, LockContended, LockedTask, TaskSkipped
from celery_redislock.testing import assert_lock_free, assert_lock_held, current_fence
from tests.helpers import assert_no_overlap, wait_until
from tests.integration.task_helpers import (
    listed,
    lock_key,
    runs,
    uniq,
    wait_started,
    worker_fixture,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]


worker = worker_fixture("dispatch", extra=["-Q", "celery,alt"])


def blocker(locks: redis.Redis, task: Any, args: tuple[Any, ...], owner: str) -> Lock:
    """Hold ``task``'s lock for ``args`` from this process, as task ``owner`` would."""
    lock = Lock(locks, task.lock_name_for(args, {}), ttl=30, owner=f"{owner}|test|0|")
    assert lock.acquire(blocking=False)
    return lock


# -- the ways of sending ---------------------------------------------------------


def test_delay_apply_async_and_send_task_by_name_share_the_lock(
    worker: Worker, capp: ModuleType, rec: redis.Redis
) -> None:
    tag, job = uniq("send"), uniq("job")
    results = []
    for _ in range(3):
        results.append(capp.lt_retry.delay(job, tag, 0.2))
        results.append(capp.lt_retry.apply_async((job, tag), {"duration": 0.2}))
        results.append(capp.app.send_task("lt.retry", args=[job, tag, 0.2]))
    for r in results:
        r.get(timeout=30)
    ran = runs(rec, tag)
    assert sorted(r["id"] for r in ran) == sorted(r.id for r in results)
    assert_no_overlap(ran)


def test_chain_group_and_chord(worker: Worker, capp: ModuleType, rec: redis.Redis) -> None:
    tag, job, cb = uniq("canvas"), uniq("job"), uniq("cb")
    chains = [
        chain(capp.lt_retry.s(job, tag, 0.2), capp.lt_rec.s(tag=cb, label="chain")).delay()
        for _ in range(3)
    ]
    grouped = group(capp.lt_retry.s(job, tag, 0.2) for _ in range(3)).delay()
    chorded = chord(capp.lt_retry.s(job, tag, 0.2) for _ in range(3))(
        capp.lt_rec.s(tag=cb, label="chord")
    )
    chain_values = [c.get(timeout=40) for c in chains]
    group_values = grouped.get(timeout=40)
    chord_value = chorded.get(timeout=40)

    ran = runs(rec, tag)
    assert len(ran) == 9
    assert_no_overlap(ran)
    # Each chain step got its own parent's return value, after contention retries.
    assert sorted(v[0]["id"] for v in chain_values) == sorted(c.parent.id for c in chains)
    assert sum(r["lock_retries"] or 0 for r in ran) > 0
    assert {v["id"] for v in group_values} <= {r["id"] for r in ran}
    assert len(group_values) == 3
    (header_values,) = chord_value  # lt.rec got the header's results as one list
    assert len(header_values) == 3 and all(v["fence"] is not None for v in header_values)
    callbacks = runs(rec, cb)
    assert sorted(c["label"] for c in callbacks) == ["chain"] * 3 + ["chord"]
    (chord_cb,) = [c for c in callbacks if c["label"] == "chord"]
    # The chord callback ran once, after all of its header had run.
    header_ids = {v["id"] for v in header_values}
    assert chord_cb["at"] >= max(r["end"] for r in ran if r["id"] in header_ids)


def test_apply_takes_the_lock_in_this_process(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    tag, job = uniq("apply"), uniq("job")
    key = lock_key(capp.lt_fail, (job, tag))
    result = capp.lt_fail.apply((job, tag, 0.05))
    assert result.successful(), result.traceback
    (run,) = runs(rec, tag)
    assert run["eager"] is True and run["fence"] is not None
    assert not locks.exists(key)

    # While a worker runs the task, an eager run of the same key contends.
    held = capp.lt_skip.delay(job, tag, 1.5)
    wait_started(rec, tag, 2)
    skipped = capp.lt_skip.apply((job, tag, 0.0))
    assert skipped.state == "FAILURE"
    assert isinstance(skipped.result, TaskSkipped)
    assert skipped.result.holder == held.id
    held.get(timeout=5)
    assert [r["id"] for r in runs(rec, tag)] == [run["id"], held.id]  # skipped: no body


def test_apply_retry_policy_waits_for_the_holder(
    worker: Worker, capp: ModuleType, rec: redis.Redis
) -> None:
    tag, job = uniq("applywait"), uniq("job")
    held = capp.lt_retry.delay(job, tag, 1.0)
    wait_started(rec, tag)
    waited = capp.lt_retry.apply((job, tag, 0.0))
    assert waited.successful(), waited.traceback
    ran = {r["id"]: r for r in runs(rec, tag)}
    assert ran[waited.id]["start"] >= ran[held.id]["end"]
    assert ran[waited.id]["fence"] > ran[held.id]["fence"]
    assert ran[waited.id]["eager"] is True


@pytest.fixture
def eager_app(redis_base: str) -> Iterator[Celery]:
    app = Celery("eager-tests", set_as_current=False)
    app.conf.update(
        task_always_eager=True,
        redislock_url=f"{redis_base}/0",
        redislock_lock_wait_timeout=0.5,
    )
    yield app
    app.close()


def test_task_always_eager_takes_the_lock(
    eager_app: Celery, locks: redis.Redis, rec: redis.Redis
) -> None:
    calls: list[Any] = []

    @eager_app.task(
        name="eager.skip",
        base=LockedTask,
        bind=False,
        on_contention="skip",
        lock_key=["k"],
        shared=False,
    )
    def skip_task(k: str) -> Any:
        calls.append(skip_task.request.lock_fence)
        return skip_task.request.lock_fence

    @eager_app.task(
        name="eager.retry", base=LockedTask, on_contention="retry", lock_key=["k"], shared=False
    )
    def retry_task(k: str) -> Any:
        return retry_task.request.lock_fence

    k = uniq("k")
    fence = skip_task.delay(k).get()
    assert isinstance(fence, int) and calls == [fence]
    assert not locks.exists(lock_key(skip_task, (k,)))
    # (The plugin's helpers, dogfooded: the stored fence is the run's, the lock free.)
    assert current_fence(eager_app, skip_task.lock_name_for((k,), {})) == fence
    assert_lock_free(skip_task, k)

    held = Lock(locks, skip_task.lock_name_for((k,), {}), ttl=30, owner="other-task|h|1|")
    assert held.acquire(blocking=False)
    try:
        assert assert_lock_held(skip_task, k).holders[0].fence == held.fence > fence
        result = skip_task.delay(k)
        assert result.state == "FAILURE"
        assert isinstance(result.result, TaskSkipped)
        assert result.result.holder == "other-task"
        assert calls == [fence]  # the body did not run
    finally:
        held.release()

    # retry -> wait when eager; after lock_wait_timeout (0.5 s) it fails, naming the holder.
    held = Lock(locks, retry_task.lock_name_for((k,), {}), ttl=30, owner="other-task|h|1|")
    assert held.acquire(blocking=False)
    try:
        t0 = time.monotonic()
        result = retry_task.delay(k)
        waited = time.monotonic() - t0
    finally:
        held.release()
    assert result.state == "FAILURE" and isinstance(result.result, LockContended)
    assert result.result.holder == "other-task"
    assert 0.45 <= waited < 2.0, waited
    assert isinstance(retry_task.delay(k).get(), int)


def test_direct_call_bypasses_the_lock(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    """task(...) is a plain function call: no message, no lock, no fence."""
    tag, job = uniq("direct"), uniq("job")
    held = blocker(locks, capp.lt_fail, (job, tag), "other-task")
    try:
        token = locks.get(held.key)
        out = capp.lt_fail(job, tag, 0.0)
        assert out["fence"] is None
        (run,) = runs(rec, tag)
        assert run["fence"] is None and run["lock_name"] is None
        assert locks.get(held.key) == token  # untouched
        assert int(locks.get(held.keys.fence)) == held.fence
    finally:
        held.release()


# -- contention retries keep the message ---------------------------------------


def test_contention_retry_preserves_the_message(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    tag, cb = uniq("keep"), uniq("cb")
    held = blocker(locks, capp.lt_probe_retry, (tag,), "other-task")
    try:
        result = capp.lt_probe_retry.apply_async(
            (tag,),
            {"duration": 0.05},
            queue="alt",
            priority=3,
            headers={"x_trace": "abc"},
            link=capp.lt_rec.s(tag=cb, label="link"),
            link_error=capp.lt_errback.s(tag=cb),
        )
        wait_until(
            lambda: [s for s in listed(rec, "retry_signals") if s["id"] == result.id],
            timeout=5,
            what="a contention retry",
        )
        time.sleep(0.3)
    finally:
        held.release()
    value = result.get(timeout=10)
    (run,) = runs(rec, tag)
    assert run["id"] == result.id == value["id"]
    assert run["lock_retries"] >= 1
    assert run["retries"] == 0
    assert run["args"] == [tag] and run["kwargs"] == {"duration": 0.05}
    assert run["delivery_info"]["routing_key"] == "alt"
    assert run["delivery_info"]["priority"] == 3
    assert run["x_trace"] == "abc"
    assert [c["task"] for c in run["callbacks"]] == ["lt.rec"]
    assert [c["task"] for c in run["errbacks"]] == ["lt.errback"]
    (called,) = wait_until(lambda: runs(rec, cb), timeout=5, what="link callback")
    assert called["label"] == "link" and called["values"] == [value]
    time.sleep(0.3)
    assert len(runs(rec, cb)) == 1  # no errback: contention retries are not errors


def test_contention_retry_keeps_link_error_and_chain(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    tag, tag2, cb = uniq("keeperr"), uniq("keepchain"), uniq("cb")
    held = blocker(locks, capp.lt_probe_retry, (tag,), "other-task")
    held2 = blocker(locks, capp.lt_probe_retry, (tag2,), "other-task")
    try:
        failing = capp.lt_probe_retry.apply_async(
            (tag,),
            {"fail": True},
            link=capp.lt_rec.s(tag=cb, label="link"),
            link_error=capp.lt_errback.s(tag=cb),
        )
        chained = chain(capp.lt_probe_retry.s(tag2), capp.lt_rec.s(tag=cb, label="chain")).delay()
        for task_id in (failing.id, chained.parent.id):
            wait_until(
                lambda task_id=task_id: [
                    s for s in listed(rec, "retry_signals") if s["id"] == task_id
                ],
                timeout=5,
                what="a contention retry",
            )
    finally:
        held.release()
        held2.release()
    with pytest.raises(ValueError):
        failing.get(timeout=10)
    value = chained.parent.get(timeout=10)
    assert chained.get(timeout=10) == [value]
    calls = wait_until(lambda: c if len(c := runs(rec, cb)) >= 2 else None, timeout=5)
    time.sleep(0.3)
    calls = runs(rec, cb)
    assert sorted(c["label"] for c in calls) == ["chain", "errback"]
    (errback,) = [c for c in calls if c["label"] == "errback"]
    assert errback["failed"] == failing.id
    (run2,) = runs(rec, tag2)
    assert run2["lock_retries"] >= 1 and run2["chain"]
