"""The peers' bugs, fixed, on real prefork workers: the shims beside the originals.

Each test publishes to a ``celery worker -A tests.compat_app`` the same
scenario on the shims and on the originals (``flavour``); where an original
has the bug, its case is ``xfail(strict=True)`` naming the peer's issue.  The
peers' store (db 4) is the shims' too: they follow ``ONCE['settings']['url']``
and ``singleton_backend_url``.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Optional

import pytest
import redis
from celery.exceptions import TimeLimitExceeded

import celery_redislock
from tests.compat.conftest import bug, peer_classes
from tests.helpers import wait_until
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

#: The worker imports the package the tests import (a work tree's, say).
_PATH = os.pathsep.join(
    [str(Path(__file__).resolve().parents[2]), str(Path(celery_redislock.__file__).parents[1])]
)


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def start(redis_base: str, name: str, concurrency: int, queue: Optional[str] = None) -> Worker:
    extra = ["-Q", queue] if queue else []
    worker = Worker(
        redis_base,
        concurrency=concurrency,
        name=name,
        app="tests.compat_app",
        extra=extra,
        env={"PYTHONPATH": _PATH},
    )
    try:
        return worker.wait_ready()
    except BaseException:
        worker.stop()
        raise


@pytest.fixture(scope="module")
def worker(redis_base: str, compat_app: ModuleType) -> Iterator[Worker]:
    if compat_app.orig is not None:
        peer_classes("orig")  # (the originals' cached clients: compat_app's store again)
    w = start(redis_base, "compat", 4)
    try:
        warm = [compat_app.shim.single.delay(uniq("warm"), uniq("warm"), 0.1) for _ in range(8)]
        for r in warm:
            r.get(timeout=30)
        yield w
    finally:
        w.stop()


def tasks_of(app: ModuleType, flavour: str) -> SimpleNamespace:
    tasks = getattr(app, flavour)
    if tasks is None:
        pytest.skip("celery-once / celery-singleton are not installed")
    return tasks  # type: ignore[no-any-return]


def publish(task: Any, *args: Any, **options: Any) -> Optional[str]:
    """The id of the job a publish queued or returned; None when refused
    (AlreadyQueued, DuplicateTaskError, or a graceful result without an id)."""
    try:
        result = task.apply_async(args, **options)
    except Exception as exc:
        if type(exc).__name__ in ("AlreadyQueued", "DuplicateTaskError"):
            return None
        raise
    return result.id  # type: ignore[no-any-return]


def accepted(task: Any, holder: str, *args: Any) -> bool:
    """Whether a publish of ``args`` now queues a new job (and not ``holder``'s)."""
    got = publish(task, *args)
    return got is not None and got != holder


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def started(rec: redis.Redis, tag: str, n: int = 1, timeout: float = 10.0) -> list[Any]:
    return wait_until(  # type: ignore[no-any-return]
        lambda: (
            s
            if len(s := [json.loads(x) for x in rec.lrange(f"started:{tag}", 0, -1)]) >= n
            else None
        ),
        timeout,
        what=f"{n} run(s) of {tag} to start",
    )


def runs(rec: redis.Redis, tag: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in rec.lrange(f"runs:{tag}", 0, -1)]


# -- the timeout -----------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["shim", "orig"])
@pytest.mark.parametrize("name", ["once_sleep", "single_expiry"])
def test_the_timeout_lets_the_key_go_while_the_job_runs(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str, name: str
) -> None:
    """celery-once README "timeout", celery-singleton README "lock_expiry": the
    key lives ``timeout`` seconds from the publish, even while the job runs."""
    task = getattr(tasks_of(compat_app, flavour), name)
    job, tag = uniq("to"), uniq("to")
    first = task.delay(job, tag, 1.8)
    began = time.monotonic()
    started(rec, tag)
    assert publish(task, job, tag, 0.0) in (None, first.id)  # held while it runs
    time.sleep(max(0.0, began + 1.15 - time.monotonic()))
    second = publish(task, job, tag, 0.0)
    assert second is not None and second != first.id  # the timeout passed: a new job
    if flavour == "shim":
        # ...which runs once the first is done: the run lock is the job's key.
        wait_until(lambda: len(runs(rec, tag)) == 2, 10, what="both runs")
        a, b = runs(rec, tag)
        assert (a["id"], b["id"]) == (first.id, second) and b["start"] >= a["end"]


@pytest.mark.parametrize(
    "flavour", bug("release with a plain DEL: a late run frees the next job's key")
)
@pytest.mark.parametrize("name", ["once_sleep", "single_expiry"])
def test_a_run_past_its_timeout_leaves_the_next_jobs_key(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str, name: str
) -> None:
    """The key a run lost at its timeout belongs to the next job: the end of the
    late run does not free it (the peers DEL it)."""
    task = getattr(tasks_of(compat_app, flavour), name)
    job, tag = uniq("late"), uniq("late")
    first = task.delay(job, tag, 1.5)
    began = time.monotonic()
    started(rec, tag)
    time.sleep(max(0.0, began + 1.15 - time.monotonic()))
    second = publish(task, job, tag, 1.0)
    assert second is not None and second != first.id
    first.get(timeout=10)
    # The late run has ended; the next job holds the key (waiting or running).
    assert publish(task, job, tag, 0.0) in (None, second)


# -- ends of a run -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["once_sleep", "single"])
def test_a_success_frees_the_key(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str, name: str
) -> None:
    """celery-singleton tests/test_singleton.py::TestSimpleTask::
    test__queue_duplicate_after_success__different_ids; celery-once README
    ("Once the task completes ... the lock will clear")."""
    task = getattr(tasks_of(compat_app, flavour), name)
    job, tag = uniq("ok"), uniq("ok")
    first = task.delay(job, tag)
    first.get(timeout=10)
    time.sleep(0.05)  # (the originals free it after the result is stored)
    second = task.delay(job, tag)
    second.get(timeout=10)
    assert second.id != first.id


@pytest.mark.parametrize("name", ["once_fail", "single_fail"])
def test_a_failure_frees_the_key(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str, name: str
) -> None:
    """celery-singleton tests/test_singleton.py::TestSimpleTask::
    test__queue_duplicate_after_error__different_ids; celery-once README
    ("or ends due to an exception")."""
    task = getattr(tasks_of(compat_app, flavour), name)
    job, tag = uniq("err"), uniq("err")
    first = task.delay(job, tag)
    with pytest.raises(Exception) as info:
        first.get(timeout=10)
    assert type(info.value).__name__ == "Flaky"
    time.sleep(0.05)
    assert accepted(task, first.id, job, tag)


@pytest.mark.parametrize(
    "flavour", bug("celery-singleton #10, #20: self.retry() is its own duplicate")
)
def test_a_retry_is_not_its_own_duplicate(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str
) -> None:
    """``self.retry()`` runs again under the same key, which frees after the last run."""
    task = tasks_of(compat_app, flavour).single_retry
    job, tag = uniq("retry"), uniq("retry")
    result = task.delay(job, tag)
    assert result.get(timeout=2.5) == result.id
    assert [r["retries"] for r in runs(rec, tag)] == [0, 1]
    assert wait_for(lambda: accepted(task, result.id, job, tag), 3)


@pytest.fixture(scope="module")
def own_worker(redis_base: str) -> Iterator[Callable[[], Worker]]:
    """A worker of its own (queue ``own``), started anew when a test killed it."""
    workers: list[Worker] = []

    def get() -> Worker:
        if not workers or workers[-1].proc.poll() is not None:
            workers.append(start(redis_base, f"compat-own{len(workers)}", 1, queue="own"))
        return workers[-1]

    yield get
    for w in workers:
        w.stop()


@pytest.mark.parametrize(
    "flavour", bug("celery-singleton #55: autoretry_for and a duplicate crash the worker")
)
def test_autoretry_with_raise_on_duplicate_runs_again(
    own_worker: Callable[[], Worker], compat_app: ModuleType, rec: redis.Redis, flavour: str
) -> None:
    """``autoretry_for`` on a ``raise_on_duplicate`` task retries and runs again
    (the original raises DuplicateTaskError inside the retry, which the
    worker's main process cannot unpickle: the whole worker stops)."""
    task = tasks_of(compat_app, flavour).single_autoretry
    worker = own_worker()
    job, tag = uniq("auto"), uniq("auto")
    result = task.apply_async((job, tag), queue="own")
    wait_for(lambda: result.ready() or worker.proc.poll() is not None, 4)
    assert worker.proc.poll() is None, "the worker stopped"
    assert result.get(timeout=1) == result.id
    assert len(runs(rec, tag)) == 2


# -- deaths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flavour",
    [
        "shim",
        # (Celery 5.7 calls the originals' on_failure / after_return in the
        # main process after a hard time limit; older releases do not.)
        pytest.param("orig", marks=pytest.mark.xfail(strict=False, reason="celery-singleton #40")),
    ],
)
@pytest.mark.parametrize("name", ["once_hard", "single_hard"])
def test_a_hard_time_limit_frees_the_key(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str, name: str
) -> None:
    """The child killed at its hard time limit: the worker's main process frees its key."""
    task = getattr(tasks_of(compat_app, flavour), name)
    job, tag = uniq("hard"), uniq("hard")
    result = task.delay(job, tag, 3.0)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=10)
    assert wait_for(lambda: accepted(task, result.id, job, tag), 1.5)


@pytest.mark.parametrize("flavour", bug("celery-singleton #29: a revoked job keeps its key"))
@pytest.mark.parametrize("name", ["once_plain", "single"])
def test_a_revoked_job_frees_its_key(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str, name: str
) -> None:
    """A job revoked while it waits frees its key when the worker discards it."""
    task = getattr(tasks_of(compat_app, flavour), name)
    job, tag = uniq("rev"), uniq("rev")
    result = task.apply_async((job, tag), countdown=0.6)
    result.revoke()
    assert wait_for(lambda: accepted(task, result.id, job, tag), 2.0)
    assert not [r for r in runs(rec, tag) if r["id"] == result.id]


@pytest.fixture(scope="module")
def killed(redis_base: str, compat_app: ModuleType, rec: redis.Redis) -> dict[str, Any]:
    """One worker SIGKILLed while it runs a job of each flavour and peer; for
    each, whether a duplicate is accepted within 4 s (lock_ttl 1.5 s)."""
    w = start(redis_base, "compat-kill", 4, queue="kill")
    out: dict[str, Any] = {}
    try:
        jobs = {}
        for flavour in ("shim", "orig"):
            tasks = getattr(compat_app, flavour)
            if tasks is None:
                continue
            for name in ("once_plain", "single"):
                job, tag = uniq("kill"), uniq("kill")
                first = tasks_of(compat_app, flavour)
                task = getattr(first, name)
                jobs[(flavour, name)] = (
                    task,
                    task.apply_async((job, tag, 30.0), queue="kill").id,
                    job,
                    tag,
                )
        for _, _, _, tag in jobs.values():
            started(rec, tag)
        w.kill(signal.SIGKILL)
        w.proc.wait(10)
        killed_at = time.monotonic()
        pending = dict(jobs)
        while pending and time.monotonic() < killed_at + 4.0:
            for key, (task, holder, job, tag) in list(pending.items()):
                if accepted(task, holder, job, tag):
                    out[key] = time.monotonic() - killed_at
                    del pending[key]
            time.sleep(0.1)
        for key in pending:
            out[key] = None
    finally:
        w.stop()
    return out


@pytest.mark.fault
@pytest.mark.parametrize(
    "flavour", bug("celery-once #147, #103, #110: a killed worker's key stays")
)
@pytest.mark.parametrize("name", ["once_plain", "single"])
def test_a_killed_workers_job_frees_its_key(
    worker: Worker, killed: dict[Any, Any], compat_app: ModuleType, flavour: str, name: str
) -> None:
    """A worker SIGKILLed mid-run: its job's key frees within the run's lease
    (``lock_ttl``, 1.5 s here), not after the timeout (celery-once: 1 h) or never
    (celery-singleton)."""
    tasks_of(compat_app, flavour)
    freed = killed[(flavour, name)]
    assert freed is not None and freed < 3.5


# -- unlock_before_run --------------------------------------------------------------


def test_unlock_before_run_frees_the_key_as_the_run_starts(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str
) -> None:
    """celery-once README "unlock_before_run"; tests/integration/test_tasks.py::
    test_delay_unlock_before_run (the key goes before the body runs)."""
    task = tasks_of(compat_app, flavour).once_ubr
    job, tag = uniq("ubr"), uniq("ubr")
    first = task.delay(job, tag, 1.0)
    started(rec, tag)
    second = publish(task, job, tag, 0.0)
    assert second is not None and second != first.id


@pytest.mark.parametrize("flavour", bug("celery-once #114: one running plus one queued"))
def test_unlock_before_run_keeps_one_running_and_one_queued(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str
) -> None:
    """With ``unlock_before_run``, one job runs and one more waits (it never runs
    beside the first); a third publish meanwhile is a duplicate of the waiting one."""
    task = tasks_of(compat_app, flavour).once_ubr
    job, tag = uniq("ubr"), uniq("ubr")
    first = task.delay(job, tag, 1.0)
    started(rec, tag)
    second = publish(task, job, tag, 0.0)
    time.sleep(0.3)
    assert publish(task, job, tag, 0.0) is None  # the second still waits
    first.get(timeout=10)
    wait_until(lambda: len(runs(rec, tag)) == 2, 10, what="both runs")
    a, b = runs(rec, tag)
    assert (a["id"], b["id"]) == (first.id, second) and b["start"] >= a["end"]


@pytest.mark.parametrize("flavour", bug("celery-singleton #3: no release as the run starts"))
def test_singleton_until_started(
    worker: Worker, compat_app: ModuleType, rec: redis.Redis, flavour: str
) -> None:
    """A Singleton task with ``unique="until_started"`` frees its key as its run
    starts (the original has no such option: it keeps the key until the end)."""
    task = tasks_of(compat_app, flavour).single_started
    job, tag = uniq("st"), uniq("st")
    first = task.delay(job, tag, 0.8)
    started(rec, tag)
    second = publish(task, job, tag, 0.0)
    assert second is not None and second != first.id
