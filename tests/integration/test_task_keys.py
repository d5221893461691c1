"""Per-argument lock keys on a real prefork worker (-c 4).

Different keys run in parallel, the same key never overlaps; positional,
keyword and default values of one argument give one lock; templates,
callables and non-JSON-native values (UUID, datetime, Decimal) work.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from decimal import Decimal
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_redislock import TaskSkipped
from tests.helpers import assert_no_overlap, intervals, peak_overlap, report, wait_until
from tests.integration.task_helpers import (
    lock_key,
    runs,
    uniq,
    wait_started,
    worker_fixture,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]


worker = worker_fixture("keys")


def held_then_contended(
    rec: redis.Redis,
    task: Any,
    holder_call: tuple[tuple[Any, ...], dict[str, Any]],
    same: list[tuple[tuple[Any, ...], dict[str, Any]]],
    other: list[tuple[tuple[Any, ...], dict[str, Any]]],
    tag: str,
) -> tuple[Any, list[Any]]:
    """Start ``holder_call`` (a skip-policy task), then check that each of ``same``
    is skipped naming it and each of ``other`` runs while it is still running."""
    holder = task.apply_async(*holder_call)
    wait_started(rec, tag)
    for args, kwargs in same:
        with pytest.raises(TaskSkipped) as info:
            task.apply_async(args, kwargs).get(timeout=5)
        assert info.value.holder == holder.id
    others = [task.apply_async(args, kwargs) for args, kwargs in other]
    values = [r.get(timeout=5) for r in others]
    holder.get(timeout=10)
    return holder, values


def test_distinct_keys_run_in_parallel_and_one_key_never_overlaps(
    worker: Worker, capp: ModuleType, rec: redis.Redis
) -> None:
    tag = uniq("par")
    jobs = [uniq("job") for _ in range(4)]
    results = [capp.lt_wait.delay(job, tag, 0.4, seq=i) for i in range(3) for job in jobs]
    for r in results:
        r.get(timeout=30)
    ran = runs(rec, tag)
    assert len(ran) == 12
    for job in jobs:
        same = [r for r in ran if r["job"] == job]
        assert len(same) == 3
        assert_no_overlap(same)
    peak = peak_overlap(intervals(ran))
    assert peak >= 2, peak
    report("distinct_keys", tasks=12, keys=4, concurrency=4, peak=peak)


def test_positional_and_keyword_arguments_take_one_lock(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    tag, job = uniq("poskw"), uniq("job")
    task = capp.lt_skip
    by_position = task.lock_name_for((job, tag), {})
    assert task.lock_name_for((), {"job": job, "tag": "x", "duration": 9}) == by_position
    assert task.lock_name_for((job,), {"tag": "x"}) == by_position
    held_then_contended(
        rec,
        task,
        ((job, tag, 1.0), {}),
        same=[((), {"job": job, "tag": tag, "duration": 0.0}), ((job,), {"tag": tag})],
        other=[((), {"job": uniq("job"), "tag": tag, "duration": 0.0})],
        tag=tag,
    )
    recorded = {r["lock_name"] for r in runs(rec, tag)}
    assert by_position in recorded
    assert not locks.exists(lock_key(task, (job, tag)))


def test_default_values_take_the_same_lock_as_explicit_ones(
    worker: Worker, capp: ModuleType, rec: redis.Redis
) -> None:
    tag, job = uniq("defaults"), uniq("job")
    task = capp.lt_defaults
    assert task.lock_name_for((job, tag), {}) == task.lock_name_for((job, tag, "eu"), {})
    assert task.lock_name_for((job, tag), {}) != task.lock_name_for((job, tag, "us"), {})
    _, values = held_then_contended(
        rec,
        task,
        ((job, tag), {"duration": 1.0}),
        same=[((job, tag, "eu", 0.0), {}), ((), {"job": job, "tag": tag, "region": "eu"})],
        other=[((job, tag, "us", 0.0), {})],
        tag=tag,
    )
    assert len(values) == 1
    regions = sorted(r["region"] for r in runs(rec, tag))
    assert regions == ["eu", "us"]


def test_bind_true_task_keys_on_its_arguments(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    tag, job = uniq("bound"), uniq("job")
    task = capp.lt_bound
    assert task.lock_name_for((job, tag), {}) == f'lt.bound:["{job}"]'
    holder = task.delay(job, tag, 1.0)
    wait_started(rec, tag)
    with pytest.raises(TaskSkipped) as info:
        task.apply_async(kwargs={"job": job, "tag": tag, "duration": 0.0}).get(timeout=5)
    assert info.value.holder == holder.id
    assert holder.get(timeout=10)["fence"] is not None
    (run,) = runs(rec, tag)
    assert run["lock_name"] == f'lt.bound:["{job}"]'
    assert run["self_fence"] == run["fence"] is not None
    assert not locks.exists(lock_key(task, (job, tag)))


def test_template_key(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    tag = uniq("tmpl")
    user = uuid.uuid4().int % 10**9
    task = capp.lt_template
    assert task.lock_name_for((user, tag), {}) == f"lt.template:user:{user}"
    holder, _ = held_then_contended(
        rec,
        task,
        ((user, tag, 1.0), {}),
        same=[((), {"user_id": user, "tag": tag, "duration": 0.0})],
        other=[((user + 1, tag, 0.0), {})],
        tag=tag,
    )
    names = {r["id"]: r["lock_name"] for r in runs(rec, tag)}
    assert names[holder.id] == f"lt.template:user:{user}"
    assert f"lt.template:user:{user + 1}" in names.values()
    assert not locks.exists(lock_key(task, (user, tag)))


def test_callable_key(worker: Worker, capp: ModuleType, rec: redis.Redis) -> None:
    tag, customer = uniq("call"), uniq("cust")
    task = capp.lt_callable
    first = {"customer": customer, "order": 1}
    assert task.lock_name_for((first, tag), {}) == f"lt.callable:customer:{customer}"
    held_then_contended(
        rec,
        task,
        ((first, tag, 1.0), {}),
        same=[(({"customer": customer, "order": 2}, tag, 0.0), {})],
        other=[(({"customer": customer + "x", "order": 3}, tag, 0.0), {})],
        tag=tag,
    )
    assert sorted(r["lock_name"] for r in runs(rec, tag)) == [
        f"lt.callable:customer:{customer}",
        f"lt.callable:customer:{customer}x",
    ]


def test_uuid_datetime_decimal_arguments(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    tag = uniq("typed")
    ident = uuid.uuid4()
    when = datetime(2024, 5, 17, 12, 30, 1, 250000, tzinfo=timezone.utc)
    amount = Decimal("12.50")
    task = capp.lt_typed
    name = task.lock_name_for((ident, when, amount, tag), {})
    key = lock_key(task, (ident, when, amount, tag))
    holder = task.delay(ident, when, amount, tag, 1.0)
    wait_started(rec, tag)
    # The worker, having decoded the message, computes the same lock as this process.
    assert wait_until(lambda: locks.get(key), timeout=2).decode().startswith(holder.id)
    with pytest.raises(TaskSkipped):
        task.apply_async(
            kwargs={"ident": uuid.UUID(str(ident)), "when": when, "amount": amount, "tag": tag}
        ).get(timeout=5)
    other = task.delay(ident, when, Decimal("13.00"), tag, 0.0)
    other.get(timeout=5)
    holder.get(timeout=10)
    ran = {r["id"]: r for r in runs(rec, tag)}
    assert set(ran) == {holder.id, other.id}
    assert ran[holder.id]["lock_name"] == name
    assert ran[holder.id]["types"] == ["UUID", "datetime", "Decimal"]
    assert ran[other.id]["lock_name"] != name
    assert not locks.exists(key)
