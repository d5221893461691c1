"""A direct call of a LockedTask made while one of its runs is under way takes no
lock, on a real prefork worker.

Two ways a task's ``__call__`` runs again, in the same process, while the
tracer's request for a run is still on top of the task's request stack:

- Celery calls a new-style errback in-process (``errback(request, exc,
  traceback)``, celery/backends/base.py) after the body failed; when the
  errback is the same task, that call is a plain function call, not a run.
- The body calls the task itself (``task(...)``).

Neither is the tracer's call for the run, so neither takes a lock: the run's
lock is acquired once and released once (``lock_acquired`` / ``lock_released``,
as the worker's receivers in tests/celery_app.py record them for lock names
with "sig-"), and its key is free after.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import redis

from tests.helpers import wait_until
from tests.integration.task_helpers import (
    listed,
    lock_key,
    postruns,
    runs,
    uniq,
    worker_fixture,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]


worker = worker_fixture("direct")


def lock_events(rec: redis.Redis, task: Any, *calls: tuple[Any, ...]) -> dict[str, list[Any]]:
    """(task id, fence) of each lock signal the worker sent for these calls' lock names."""
    events = [e for args in calls for e in listed(rec, f"sig:{task.lock_name_for(args, {})}")]
    return {
        s: sorted((e["id"], e["fence"]) for e in events if e["signal"] == s)
        for s in ("lock_acquired", "lock_released")
    }


def test_new_style_errback_of_the_same_task_takes_no_lock(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    tag = uniq("sig-errback")
    task = capp.lt_self_errback
    result = task.apply_async((tag,), link_error=task.s(tag))
    with pytest.raises(ValueError):
        result.get(timeout=15)
    # task_postrun comes after the errbacks and after_return: every signal of the
    # run has been sent by then.
    (seen,) = postruns(rec, result.id)
    assert seen["state"] == "FAILURE" and seen["error"] is None
    assert seen["holder"] is None, f"lock still held at postrun by {seen['holder']}"
    body, errback = wait_until(lambda: r if len(r := runs(rec, tag)) >= 2 else None)
    assert (body["kind"], errback["kind"]) == ("body", "errback")
    assert errback["failed"] == result.id and "boom" in errback["exc"]
    assert body["fence"] is not None
    events = lock_events(rec, task, (tag,))
    # One lock, the run's: acquired once, released once.
    assert events["lock_acquired"] == [(result.id, body["fence"])]
    assert events["lock_released"] == events["lock_acquired"]
    assert not locks.exists(lock_key(task, (tag,)))
    # The errback ran in the failed run's process, under its request and lock:
    # it took none of its own.
    assert errback["pid"] == body["pid"] and errback["id"] == result.id
    assert (errback["fence"], errback["hold_fence"]) == (body["fence"], body["fence"])


@pytest.mark.parametrize("depth", [1, 3])
def test_a_body_calling_its_own_task_takes_no_second_lock(
    worker: Worker, capp: ModuleType, rec: redis.Redis, locks: redis.Redis, depth: int
) -> None:
    """Each level finds the run's request on top of the stack, or (from the third
    level on) the copy of it, called_directly=False and the same id, that
    Celery's Task.__call__ pushed for the level above: the worker's patched
    Task.__call__ (trace.setup_worker_optimizations) pushes none for the first
    direct call of a run, a copy for each one after."""
    tag = uniq("sig-selfcall")
    task = capp.lt_self_call
    result = task.delay(tag, depth)
    levels = result.get(timeout=15)
    (seen,) = postruns(rec, result.id)
    assert seen["state"] == "SUCCESS" and seen["error"] is None
    assert seen["holder"] is None, f"lock still held at postrun by {seen['holder']}"
    assert [lv["depth"] for lv in levels] == list(range(depth, -1, -1))
    outer = levels[0]
    assert outer["fence"] is not None and outer["hold_fence"] == outer["fence"]
    calls = [(tag, d) for d in range(depth + 1)]
    events = lock_events(rec, task, *calls)
    # One lock, the run's: acquired once, released once.
    assert events["lock_acquired"] == [(result.id, outer["fence"])]
    assert events["lock_released"] == events["lock_acquired"]
    for args in calls:
        assert not locks.exists(lock_key(task, args))
    for lv in levels[1:]:
        # Each direct call ran in the run's process under the run's lock, and
        # saw the run's request (recent Celery releases copy it for a direct call;
        # before, a direct call's own request is empty).
        assert lv["pid"] == outer["pid"]
        seen = (lv["id"], lv["fence"], lv["hold_fence"])
        assert seen in ((result.id, outer["fence"], outer["fence"]), (None, None, None)), seen
    for lv in levels:
        # What the run keeps on its request never becomes a header to send.
        assert not {"redislock", "lock_fence"} & set(lv["headers"]), lv["headers"]
