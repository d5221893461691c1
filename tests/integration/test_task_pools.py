"""LockedTask on the threads (-c 4) and solo pools (prefork is every other module).

Under threads one task instance serves four threads at once, so per-run
state must live on the request: mixed policies, keys and fences must come
out right.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
import redis
from _pytest.fixtures import SubRequest

from celery_redislock import TaskSkipped
from tests.helpers import assert_no_overlap, intervals, peak_overlap, report
from tests.integration.task_helpers import lock_key, runs, start_worker, uniq, wait_started
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

CONCURRENCY = {"threads": 4, "solo": 1}


@pytest.fixture(scope="module", params=list(CONCURRENCY))
def pool(request: SubRequest, redis_base: str, capp: ModuleType) -> Iterator[str]:
    name = request.param
    queue = f"pool-{name}"
    # Its own queue: a worker of another pool left running can't take its tasks.
    w: Worker = start_worker(
        redis_base,
        name,
        pool=name,
        concurrency=CONCURRENCY[name],
        warm=capp,
        queue=queue,
        extra=["-Q", queue],
    )
    yield name
    w.stop()


def test_same_key_serialises_distinct_keys_overlap(
    pool: str, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    queue = f"pool-{pool}"
    tag, job = uniq(pool), uniq("job")
    others = [uniq("job") for _ in range(3)]
    results = [
        capp.lt_retry.apply_async((job, tag, 0.2), {"seq": i}, queue=queue) for i in range(6)
    ]
    results += [capp.lt_wait.apply_async((o, tag, 0.4), queue=queue) for o in others]
    for r in results:
        r.get(timeout=40)
    ran = runs(rec, tag)
    assert sorted(r["id"] for r in ran) == sorted(r.id for r in results)
    same = [r for r in ran if r["job"] == job]
    assert len(same) == 6
    assert_no_overlap(same)
    fences = [r["fence"] for r in sorted(same, key=lambda r: r["start"])]
    assert fences == sorted(set(fences))
    assert all(r["fence"] == r["hold_fence"] for r in ran)
    assert all(r["retries"] == 0 for r in ran)
    peak = peak_overlap(intervals(ran))
    if pool == "solo":
        assert peak == 1
    else:
        assert peak >= 2, peak
    assert not locks.exists(lock_key(capp.lt_retry, (job, tag)))
    report("pool", pool=pool, runs=len(ran), peak=peak)


def test_skip_names_the_holder(pool: str, capp: ModuleType, rec: redis.Redis) -> None:
    queue = f"pool-{pool}"
    tag, job = uniq(pool), uniq("job")
    holder = capp.lt_skip.apply_async((job, tag, 1.0), queue=queue)
    wait_started(rec, tag)
    dupes = [capp.lt_skip.apply_async((job, tag, 0.0), queue=queue) for _ in range(5)]
    if pool == "solo":
        # One task at a time: the duplicates wait in the queue, run after the
        # holder has released, and are not skipped.
        for d in dupes:
            assert d.get(timeout=10)["fence"] is not None
        ran = runs(rec, tag)
        assert [r["id"] for r in ran] == [holder.id] + [d.id for d in dupes]
        assert_no_overlap(ran)
        return
    for d in dupes:
        with pytest.raises(TaskSkipped) as info:
            d.get(timeout=5)
        assert info.value.holder == holder.id
    holder.get(timeout=5)
    assert [r["id"] for r in runs(rec, tag)] == [holder.id]
