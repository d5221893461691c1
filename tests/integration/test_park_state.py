"""A parked run's result state and log lines, on a real prefork worker.

A parked run is PARKED in Celery's result store, with meta naming what it
waits for, until its re-published run stores states of its own; ``get()``
waits through it.  PARKED never replaces a state stored before it (an
outcome, another run's STARTED or RETRY), only nothing or the run's own
STARTED.  A park logs at INFO, a skip at WARNING.  The lock is held by the
test itself, so a run stays parked for exactly as long as the test says.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import celery.app.task
import celery.exceptions
import pytest
import redis
from celery import states
from celery.app.task import Context

from celery_redislock import PARKED, Lock, Semaphore, TaskSkipped, config
from celery_redislock.primitives import keys
from celery_redislock.tasks import parked_state
from celery_redislock.tasks import parking as park
from celery_redislock.tasks.owners import owner_prefix
from tests.helpers import wait_until
from tests.integration.task_helpers import (
    base_of,
    flush_state,
    limits_app,
    limits_workers,
    runs,
    uniq,
    wait_runs,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

#: Reservation of a granted parked run (s): its re-published run claims it well within.
RESERVE = 2.0


@pytest.fixture(scope="module")
def app(redis_url: str) -> Any:
    return limits_app(redis_url)


@pytest.fixture(scope="module")
def worker(redis_url: str, app: Any) -> Iterator[Worker]:
    flush_state(redis_url)
    env = {"REDISLOCK_TEST_PARK_RESERVE": str(RESERVE)}
    with limits_workers(redis_url, ["park-state"], concurrency=2, env=env) as [started]:
        tag = uniq("warm")
        warm = [submit(app, "l.park", f"warm-{i}", tag, 0.01, i) for i in range(4)]
        for r in warm:
            r.get(timeout=30)
        yield started


@pytest.fixture(scope="module")
def results(redis_url: str) -> Iterator[redis.Redis]:
    """Client on db 2, Celery's result store."""
    client = redis.Redis.from_url(f"{base_of(redis_url)}/2")
    yield client
    client.close()


def submit(app: Any, name: str, *args: Any, **options: Any) -> Any:
    return app.signature(name, args).apply_async(**options)


def result_key(app: Any, task_id: str) -> str:
    return str(app.backend.get_key_for_task(task_id).decode())


def stored(app: Any, task_id: str) -> dict[str, Any]:
    """The result as stored now, decoded as Celery decodes it (no cache)."""
    meta: dict[str, Any] = app.backend.get_task_meta(task_id, cache=False)
    return meta


#: The owner-token prefix of the test's holds: their holder reads as task "holder".
HOLDER = owner_prefix("holder", "test", 0)


def lock_of(app: Any, locks: redis.Redis, name: str, *args: Any) -> Lock:
    """The lock task ``name`` takes for ``args``, for the test to hold."""
    lock_name = app.tasks[name].lock_name_for(args, {})
    return Lock(locks, lock_name, ttl=30, prefix=config.settings_for(app).key_prefix, owner=HOLDER)


@contextlib.contextmanager
def holding(app: Any, *prims: Any) -> Iterator[Any]:
    """``prims`` held by the test; their releases re-publish the runs parked
    behind them, as a task's release would.  Yields the first."""
    for prim in prims:
        park.configure(prim, RESERVE, park.publisher(app))
        assert prim.acquire(blocking=False)
    try:
        yield prims[0]
    finally:
        for prim in prims:
            prim.release()


def wait_parked(app: Any, locks: redis.Redis, lock: Lock, count: int = 1) -> None:
    k = keys.lock_keys(config.settings_for(app).key_prefix, lock.name)
    wait_until(lambda: locks.hlen(k.pmsg) == count, 10, 0.01, f"{count} run(s) to park")


@contextlib.contextmanager
def published(app: Any, redis_url: str, task_id: str) -> Iterator[Callable[[], list[str]]]:
    """The states Celery's result consumers are told of for ``task_id`` (PUBLISH on
    its result key), as a function returning those seen so far, in order."""
    client = redis.Redis.from_url(f"{base_of(redis_url)}/2")
    pubsub = client.pubsub()
    seen: list[str] = []
    try:
        pubsub.subscribe(result_key(app, task_id))
        confirmed = pubsub.get_message(timeout=5)  # subscribed before anything is sent
        assert confirmed is not None and confirmed["type"] == "subscribe", confirmed

        def states_seen() -> list[str]:
            while (message := pubsub.get_message(timeout=0.05)) is not None:
                seen.append(app.backend.decode_result(message["data"])["status"])
            return seen

        yield states_seen
    finally:
        pubsub.close()
        client.close()


def lines_of(worker: Worker, task_id: str) -> list[str]:
    return [line for line in worker.output().splitlines() if f"[{task_id}]" in line]


def logged(worker: Worker, task_id: str, text: str) -> str:
    """The worker's log line of ``task_id`` saying ``text``, once it is there."""
    found: str = wait_until(
        lambda: next((line for line in lines_of(worker, task_id) if text in line), None),
        10,
        0.02,
        f"a log line of {task_id} saying {text!r}",
    )
    return found


# -- the state ---------------------------------------------------------------------------


def test_a_parked_run_is_parked_until_the_lock_is_released_then_succeeds(
    app: Any, redis_url: str, rec: redis.Redis, locks: redis.Redis, worker: Worker
) -> None:
    tag = uniq("parked")
    args = ("parked", tag, 0.05)
    task_id = uniq("parked-run")
    with published(app, redis_url, task_id) as states_seen:
        with holding(app, lock_of(app, locks, "l.park_probe", *args)) as lock:
            result = submit(app, "l.park_probe", *args, task_id=task_id)
            wait_parked(app, locks, lock)
            meta = wait_until(
                lambda: m if (m := stored(app, task_id))["status"] == PARKED else None,
                10,
                0.01,
                "the state PARKED",
            )
            assert meta["result"] == {"kind": "lock", "name": lock.name, "holder": "holder"}
            assert result.state == PARKED
            assert result.info == meta["result"]
            # get() waits through PARKED: nothing is ready while the lock is held.
            with pytest.raises(celery.exceptions.TimeoutError):
                result.get(timeout=1.0)
            assert not result.ready()
            assert stored(app, task_id)["status"] == PARKED
            released = time.monotonic()
        value = result.get(timeout=10)
        assert result.state == states.SUCCESS
        [run] = runs(rec, tag)
        assert run["id"] == task_id and value["fence"] == run["fence"]
        assert run["start"] >= released
        # Result consumers were told of PARKED, then of the outcome.
        assert wait_until(lambda: s if len(s := states_seen()) >= 2 else None, 5) == [
            PARKED,
            states.SUCCESS,
        ]


def test_a_semaphore_run_parks_with_its_kind_and_name(
    app: Any, locks: redis.Redis, worker: Worker
) -> None:
    tag = uniq("sem")
    name = app.tasks["l.sem3_park"].lock_name_for((tag,), {})
    prefix = config.settings_for(app).key_prefix
    permits = [Semaphore(locks, name, 3, 30, prefix=prefix, owner=HOLDER) for _ in range(3)]
    with holding(app, *permits):
        result = submit(app, "l.sem3_park", tag, 0.05)
        meta = wait_until(
            lambda: m if (m := stored(app, result.id))["status"] == PARKED else None,
            10,
            0.01,
            "the state PARKED",
        )
        assert meta["result"] == {"kind": "semaphore", "name": name, "holder": "holder"}
    assert result.get(timeout=10)["fence"] is not None
    assert result.state == states.SUCCESS


def test_a_run_that_tracks_started_is_parked_over_its_own_started(
    app: Any, redis_url: str, locks: redis.Redis, worker: Worker
) -> None:
    tag = uniq("tracked")
    args = ("tracked", tag, 0.05)
    task_id = uniq("tracked-run")
    with published(app, redis_url, task_id) as states_seen:
        with holding(app, lock_of(app, locks, "l.park_tracked", *args)) as lock:
            result = submit(app, "l.park_tracked", *args, task_id=task_id)
            wait_parked(app, locks, lock)
            wait_until(lambda: stored(app, task_id)["status"] == PARKED, 10, 0.01, "PARKED")
            assert states_seen() == [states.STARTED, PARKED]
        result.get(timeout=10)
        assert result.state == states.SUCCESS
        # The re-published run's own STARTED, then its outcome.
        assert wait_until(lambda: s if len(s := states_seen()) >= 4 else None, 5) == [
            states.STARTED,
            PARKED,
            states.STARTED,
            states.SUCCESS,
        ]


@pytest.mark.parametrize("how", ["task", "call"])
def test_a_run_that_ignores_its_result_stores_nothing_when_parked(
    how: str,
    app: Any,
    rec: redis.Redis,
    locks: redis.Redis,
    results: redis.Redis,
    worker: Worker,
) -> None:
    name, options = (
        ("l.park_quiet", {}) if how == "task" else ("l.park_probe", {"ignore_result": True})
    )
    tag = uniq("quiet")
    args = ("quiet", tag, 0.05)
    task_id = uniq("quiet-run")
    with holding(app, lock_of(app, locks, name, *args)) as lock:
        submit(app, name, *args, task_id=task_id, **options)
        wait_parked(app, locks, lock)
        logged(worker, task_id, "parked until it is released")
        assert results.exists(result_key(app, task_id)) == 0
    wait_runs(rec, tag, 1, 10)
    logged(worker, task_id, "succeeded")
    if how == "call" and not hasattr(celery.app.task, "get_actual_ignore_result"):
        # Before Celery 5.5, signature_from_request() drops a per-call ignore_result:
        # the re-published run stores its outcome, as Celery's own retry does there.
        return
    assert results.exists(result_key(app, task_id)) == 0


#: States stored for a task id before a run of it parks, each left as it is.
EARLIER = {
    "SUCCESS": (states.SUCCESS, {"earlier": True}),
    "FAILURE": (states.FAILURE, ValueError("earlier")),
    "RETRY": (states.RETRY, ValueError("earlier")),
    "STARTED on another worker": (states.STARTED, {"pid": os.getpid(), "hostname": "other@host"}),
    # The worker's node name (tests.workers: "-n NAME@%h"), another pool process.
    "STARTED by another process": (
        states.STARTED,
        {"pid": 1, "hostname": f"park-state-{os.getpid()}@{socket.gethostname()}"},
    ),
}


@pytest.mark.parametrize("earlier", list(EARLIER))
def test_parked_never_replaces_a_state_stored_before(
    earlier: str,
    app: Any,
    rec: redis.Redis,
    locks: redis.Redis,
    results: redis.Redis,
    worker: Worker,
) -> None:
    state, value = EARLIER[earlier]
    tag = uniq("earlier")
    args = ("earlier", tag, 0.05)
    task_id = uniq("earlier-run")
    app.backend.store_result(task_id, value, state)
    before = results.get(result_key(app, task_id))
    with holding(app, lock_of(app, locks, "l.park_probe", *args)) as lock:
        submit(app, "l.park_probe", *args, task_id=task_id)
        wait_parked(app, locks, lock)
        logged(worker, task_id, "parked until it is released")
        time.sleep(0.2)
        assert results.get(result_key(app, task_id)) == before
    wait_runs(rec, tag, 1, 10)


def test_a_state_written_between_the_read_and_the_write_wins(
    app: Any, results: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compare-and-set itself, in this process: PARKED is about to replace the
    run's own STARTED when the re-published run's SUCCESS lands in between."""
    task_id = uniq("swap")
    request = Context(id=task_id, hostname="here@host", ignore_result=False)
    task = SimpleNamespace(name="t.swap", backend=app.backend, ignore_result=False)
    prim = SimpleNamespace(noun="lock", name="swap")
    own = {"pid": os.getpid(), "hostname": "here@host"}

    app.backend.store_result(task_id, own, states.STARTED)
    assert parked_state.mark_parked(task, request, prim, "h")  # over its own STARTED
    assert stored(app, task_id)["status"] == PARKED

    app.backend.store_result(task_id, own, states.STARTED)
    decode = app.backend.decode_result

    def decode_then_succeed(payload: Any) -> Any:
        monkeypatch.undo()  # once: storing decodes too
        app.backend.store_result(task_id, {"done": True}, states.SUCCESS)
        return decode(payload)

    monkeypatch.setattr(app.backend, "decode_result", decode_then_succeed)
    assert not parked_state.mark_parked(task, request, prim, "h")
    meta = stored(app, task_id)
    assert (meta["status"], meta["result"]) == (states.SUCCESS, {"done": True})


# -- the log -----------------------------------------------------------------------------


def test_a_park_logs_at_info_and_a_skip_at_warning(
    app: Any, rec: redis.Redis, locks: redis.Redis, worker: Worker
) -> None:
    tag = uniq("logs")
    park_args, skip_args = ("logs-park", tag, 0.05), ("logs-skip", tag, 0.05)
    with holding(app, lock_of(app, locks, "l.park_probe", *park_args)) as lock:
        parked = submit(app, "l.park_probe", *park_args)
        wait_parked(app, locks, lock)
        line = logged(worker, parked.id, "parked until it is released")
    with holding(app, lock_of(app, locks, "l.skip", *skip_args)):
        skipped = submit(app, "l.skip", *skip_args)
        with pytest.raises(TaskSkipped):
            skipped.get(timeout=10)
    parked.get(timeout=10)

    assert " INFO/ForkPoolWorker-" in line
    assert f"l.park_probe[{parked.id}]: lock {lock.name!r} is held by task holder" in line
    # No line of the parked run is a WARNING or worse: parking is the normal path.
    assert [x for x in lines_of(worker, parked.id) if "INFO/" not in x] == []
    skip_line = logged(worker, skipped.id, "skipped (on_contention=skip)")
    assert " WARNING/ForkPoolWorker-" in skip_line
