"""Every way a LockedTask run can end leaves its lock free, on a real prefork worker.

``lt.outcome`` (on_contention="fail", so a lock left behind shows up as a
LockContended failure of the next run) ends by success, exception,
``self.retry()``, Ignore, Reject or SoftTimeLimitExceeded.  A task_postrun
receiver in the worker records the lock key's value at that moment (after
the tracer is done with the run), and the test checks the key again itself.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded

from celery_redislock import config
from celery_redislock.primitives import keys
from tests.integration.task_helpers import (
    lock_key,
    postruns,
    runs,
    uniq,
    worker_fixture,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]


worker = worker_fixture("outcomes")


OUTCOMES = {
    # kind: (apply_async options, postrun states, exception get() raises or None)
    "success": ({}, ["SUCCESS"], None),
    "raise": ({}, ["FAILURE"], ValueError),
    "retry": ({}, ["RETRY", "SUCCESS"], None),
    "ignore": ({}, ["IGNORED"], None),
    "reject": ({}, ["REJECTED"], None),
    "soft": ({"soft_time_limit": 0.5}, ["FAILURE"], SoftTimeLimitExceeded),
}


@pytest.mark.parametrize("kind", list(OUTCOMES))
def test_lock_is_free_right_after_the_run(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis, kind: str
) -> None:
    options, states, raises = OUTCOMES[kind]
    tag = uniq(kind)
    key = lock_key(capp.lt_outcome, (tag, kind))
    # countdown 1 s: the retried run comes after the first run's postrun.
    result = capp.lt_outcome.apply_async(
        (tag, kind, 3.0 if kind == "soft" else 0.0, 1.0), **options
    )
    if raises is not None:
        with pytest.raises(raises):
            result.get(timeout=15)
    elif kind in ("success", "retry"):
        assert result.get(timeout=15)["fence"] is not None
    seen = postruns(rec, result.id, len(states))
    assert [p["state"] for p in seen] == states
    for p in seen:
        assert p["error"] is None
        # The lock key was gone when task_postrun fired for this run.
        assert p["holder"] is None, f"{kind}: lock still held at postrun by {p['holder']}"
    assert not locks.exists(key)
    ran = runs(rec, tag)
    assert len(ran) == len(states)
    assert all(r["fence"] is not None and r["fence"] == r["hold_fence"] for r in ran)


def test_an_after_return_that_skips_super_still_frees_the_lock(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    """The release is sent when the body ends; after_return only reads its reply.
    A subclass that does not call super() leaves the reply to the child's next
    call to Redis: every run still finds the lock free (policy "fail")."""
    tag = uniq("forgetful")
    for _ in range(6):
        result = capp.lt_forgetful.delay(tag)
        assert result.get(timeout=15)["fence"] is not None
        (seen,) = postruns(rec, result.id)
        assert seen["state"] == "SUCCESS" and seen["holder"] is None
    assert not locks.exists(lock_key(capp.lt_forgetful, (tag,)))
    fences = [r["fence"] for r in runs(rec, tag)]
    assert len(fences) == 6 and fences == sorted(set(fences))


def test_retried_run_does_not_find_its_own_lock_held(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    """self.retry(countdown=0): the retry message is out before the first run's
    ``finally``; had the lock not been released first, the retried run (policy
    "fail") would fail with LockContended, or (policy "retry") chase itself."""
    tags = [uniq("selfretry") for _ in range(6)]
    results = [capp.lt_outcome.delay(tag, "retry", 0.0, 0.0) for tag in tags]
    for tag, result in zip(tags, results):
        assert result.get(timeout=15)["fence"] is not None, tag
        ran = runs(rec, tag)
        assert [r["retries"] for r in ran] == [0, 1]
        assert ran[0]["fence"] < ran[1]["fence"]
        assert not locks.exists(lock_key(capp.lt_outcome, (tag, "retry")))


def test_fence_is_readable_in_the_body_and_strictly_increases(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    tag = uniq("fence")
    values = [capp.lt_outcome.delay(tag, "success").get(timeout=10) for _ in range(5)]
    ran = runs(rec, tag)
    fences = [r["fence"] for r in ran]
    assert [v["fence"] for v in values] == fences
    # request.lock_fence and request.redislock.fence agree.
    assert [r["hold_fence"] for r in ran] == fences
    assert all(isinstance(f, int) for f in fences)
    assert all(a < b for a, b in zip(fences, fences[1:])), fences
    name = capp.lt_outcome.lock_name_for((tag, "success"), {})
    prefix = config.settings_for(capp.app).key_prefix
    assert int(locks.get(keys.lock_keys(prefix, name).fence)) == fences[-1]
