"""Unique jobs as they are published, against a real prefork worker.

The worker runs ``tests.unique_app`` (tests.celery_app's app plus the
``u.*`` tasks).  Messages meant to stay queued go to a queue no worker reads,
where the test counts them in the broker (db 1).  Round trips to the lock
store are counted client-side, by a counting client in place of the app's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import chain, chord, group

from celery_redislock import AlreadyQueued, TaskSuperseded, config, signals
from celery_redislock.primitives import keys
from celery_redislock.tasks import parking
from tests.helpers import counting_client, intervals, peak_overlap, wait_until
from tests.integration.task_helpers import (
    held,
    runs,
    uniq,
    wait_runs,
    wait_started,
    worker_fixture,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

#: A queue no worker reads: what is published there stays queued.
NOBODY = "redislock-nobody"


worker = worker_fixture("unique", app="tests.unique_app")


@pytest.fixture
def broker(redis_base: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(f"{redis_base}/1")
    client.delete(NOBODY)
    yield client
    client.delete(NOBODY)
    client.close()


@pytest.fixture
def duplicates() -> Iterator[list[dict[str, Any]]]:
    """What ``task_duplicate`` reported in this process during the test."""
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any = None, **kw: Any) -> None:
        seen.append(kw)

    signals.task_duplicate.connect(receiver, weak=False, dispatch_uid="tests.duplicates")
    yield seen
    signals.task_duplicate.disconnect(dispatch_uid="tests.duplicates")


def queued(broker: redis.Redis) -> int:
    return int(broker.llen(NOBODY))


@pytest.mark.parametrize("on_duplicate", ["return", "raise"])
def test_fifty_concurrent_publishes_queue_one_message(
    uapp: ModuleType, broker: redis.Redis, on_duplicate: str, duplicates: list[dict[str, Any]]
) -> None:
    task = uapp.finished if on_duplicate == "return" else uapp.finished_raise
    job, tag = uniq("race"), uniq("race")
    barrier = threading.Barrier(50)
    ids: list[str] = []
    refused: list[AlreadyQueued] = []

    def publish() -> None:
        barrier.wait()
        # ignore_result: a thread's send would subscribe to the result on a
        # backend of its own (app.backend is one per thread), which Celery 5.3
        # never closes once the thread ends.
        try:
            ids.append(task.apply_async((job, tag), queue=NOBODY, ignore_result=True).id)
        except AlreadyQueued as exc:
            refused.append(exc)

    threads = [threading.Thread(target=publish) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert queued(broker) == 1
    holder = task.unique_holder(job, tag)
    if on_duplicate == "return":
        assert len(ids) == 50 and set(ids) == {holder}
    else:
        assert ids == [holder] and len(refused) == 49
        assert {e.task_id for e in refused} == {holder}
        assert all(e.key == task.unique_key_for((job, tag), {}) for e in refused)
    assert len(duplicates) == 49
    assert {d["existing_id"] for d in duplicates} == {holder}
    assert {d["action"] for d in duplicates} == {on_duplicate}
    assert task.release_unique(job, tag) == holder
    assert task.unique_holder(job, tag) is None


def test_a_publish_and_a_duplicate_each_take_one_round_trip(
    uapp: ModuleType, broker: redis.Redis, redis_base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, trips = counting_client(f"{redis_base}/0")
    client.ping()
    monkeypatch.setattr(config, "client_for", lambda app: client)
    job, tag = uniq("rt"), uniq("rt")
    trips.reset()
    first = uapp.finished.apply_async((job, tag), queue=NOBODY)
    assert trips.names() == [["EVALSHA"]]
    assert queued(broker) == 1
    trips.reset()
    again = uapp.finished.apply_async((job, tag), queue=NOBODY)
    assert trips.names() == [["EVALSHA"]]
    assert queued(broker) == 1  # no message for the duplicate
    assert again.id == first.id
    uapp.finished.release_unique(job, tag)
    client.close()


def test_until_finished_refuses_while_queued_and_running_then_accepts(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("fin"), uniq("fin")
    first = uapp.finished.apply_async((job, tag, 1.0), countdown=0.5)
    assert uapp.finished.delay(job, tag, 0.0).id == first.id  # queued
    wait_started(rec, tag)
    assert uapp.finished.delay(job, tag, 0.0).id == first.id  # running
    first.get(timeout=10)
    wait_until(lambda: uapp.finished.unique_holder(job, tag) is None, 5, what="the key to go")
    second = uapp.finished.delay(job, tag, 0.0)
    assert second.id != first.id
    second.get(timeout=10)
    assert [r["id"] for r in runs(rec, tag)] == [first.id, second.id]


@pytest.mark.parametrize("task_name", ["started_park", "coalesce"])
def test_one_running_and_one_queued_per_key(
    worker: Worker, uapp: ModuleType, rec: redis.Redis, task_name: str
) -> None:
    """celery-once's ask: while a run goes on, one more may wait, and no more."""
    task = getattr(uapp, task_name)
    job, tag = uniq("once"), uniq("once")
    running = task.delay(job, tag, 1.0, 0)
    wait_started(rec, tag)
    waiting = task.delay(job, tag, 0.1, 1)
    assert waiting.id != running.id  # accepted: the first one has started
    more = [task.delay(job, tag, 0.1, i) for i in range(2, 6)]
    assert {m.id for m in more} == {waiting.id}
    running.get(timeout=10)
    waiting.get(timeout=10)
    ran = runs(rec, tag)
    assert [r["seq"] for r in ran] == [0, 1]
    assert peak_overlap(intervals(ran)) == 1


def test_replace_supersedes_the_queued_job_visibly(
    worker: Worker, uapp: ModuleType, rec: redis.Redis, duplicates: list[dict[str, Any]]
) -> None:
    job, tag = uniq("rep"), uniq("rep")
    old = uapp.replacing.apply_async((job, tag, 0.0, 1), countdown=1.0)
    new = uapp.replacing.apply_async((job, tag, 0.0, 2), countdown=1.0)
    assert new.id != old.id
    with pytest.raises(TaskSuperseded) as err:
        old.get(timeout=10)
    assert err.value.task_id == new.id
    new.get(timeout=10)
    assert [r["seq"] for r in runs(rec, tag)] == [2]
    assert [(d["task_id"], d["existing_id"], d["action"]) for d in duplicates] == [
        (new.id, old.id, "replace")
    ]


def test_a_parked_job_superseded_meanwhile_gives_its_turn_to_the_next(
    worker: Worker, uapp: ModuleType, rec: redis.Redis, locks: redis.Redis
) -> None:
    job, tag = uniq("reppark"), uniq("reppark")
    task = uapp.replacing_park
    # The test's release re-publishes the parked run as a task's would.
    with held(locks, task, (job, tag), parking.publisher(task.app)) as blocker:
        old = task.delay(job, tag, 0.0, 1)
        wait_until(lambda: "parked until it is released" in worker.output(), 10, what="a park")
        new = task.delay(job, tag, 0.0, 2)
        assert new.id != old.id
        time.sleep(0.3)  # the new one parks too, behind the old one
    # Handed over to the old one, which is superseded, and so to the new one.
    with pytest.raises(TaskSuperseded):
        old.get(timeout=10)
    new.get(timeout=10)
    assert [r["seq"] for r in runs(rec, tag)] == [2]
    k = keys.lock_keys(config.settings_for(task.app).key_prefix, blocker.name)
    wait_until(lambda: not locks.exists(k.lock, k.queue, k.inflight), 5, what="nothing left")


def test_debounce_runs_only_the_last_publish_of_a_burst(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("deb"), uniq("deb")
    sent = []
    for seq in range(5):
        sent.append(uapp.debounced.delay(job, tag, 0.0, seq))
        time.sleep(0.1)
    assert len({r.id for r in sent}) == 5
    sent[-1].get(timeout=10)
    for r in sent[:-1]:
        with pytest.raises(TaskSuperseded):
            r.get(timeout=10)
    ran = runs(rec, tag)
    assert [r["seq"] for r in ran] == [4]
    assert ran[0]["id"] == sent[-1].id


def test_throttle_accepts_one_publish_per_window(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("thr"), uniq("thr")
    first = uapp.throttled.delay(job, tag, 0.0, 0)
    assert uapp.throttled.delay(job, tag, 0.0, 1).id == first.id
    first.get(timeout=10)
    assert uapp.throttled.delay(job, tag, 0.0, 2).id == first.id  # done, still in the window
    time.sleep(1.1)
    later = uapp.throttled.delay(job, tag, 0.0, 3)
    assert later.id != first.id
    later.get(timeout=10)
    assert [r["seq"] for r in runs(rec, tag)] == [0, 3]


def test_a_message_nobody_consumes_frees_its_key_within_unique_ttl(
    uapp: ModuleType, broker: redis.Redis
) -> None:
    job, tag = uniq("ttl"), uniq("ttl")
    options = {"queue": NOBODY, "redislock": {"unique_ttl": 0.6}}
    first = uapp.finished.apply_async((job, tag), **options)
    assert uapp.finished.apply_async((job, tag), **options).id == first.id
    time.sleep(0.7)
    assert uapp.finished.unique_holder(job, tag) is None
    assert uapp.finished.apply_async((job, tag), **options).id != first.id
    assert queued(broker) == 2
    uapp.finished.release_unique(job, tag)


def test_a_countdown_holds_the_key_for_its_delay_however_long(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("eta"), uniq("eta")
    short = {"unique_ttl": 0.3}
    first = uapp.finished.apply_async((job, tag, 0.0), countdown=1.5, redislock=short)
    time.sleep(1.0)  # past unique_ttl, within the countdown
    assert uapp.finished.apply_async((job, tag, 0.0), redislock=short).id == first.id
    first.get(timeout=10)
    assert len(runs(rec, tag)) == 1


def test_a_duplicate_inside_a_chain_fails_it_visibly(
    worker: Worker, uapp: ModuleType, capp: ModuleType, rec: redis.Redis
) -> None:
    job, tag = uniq("chain"), uniq("chain")
    holder = uapp.finished.apply_async((job, tag, 0.0), countdown=2.0)
    result = chain(uapp.finished.s(job, tag, 0.0), capp.lt_rec.s(tag=tag, label="after")).delay()
    with pytest.raises(AlreadyQueued) as err:
        result.get(timeout=10)
    assert err.value.task_id == holder.id
    holder.get(timeout=10)
    assert [r.get("label") for r in runs(rec, tag)] == [None]  # only the holder ran


def test_a_duplicate_inside_a_group_or_chord_fails_its_member_only(
    worker: Worker, uapp: ModuleType, capp: ModuleType, rec: redis.Redis
) -> None:
    job, tag, other = uniq("grp"), uniq("grp"), uniq("grp")
    holder = uapp.finished.apply_async((job, tag, 0.0), countdown=2.0)
    members = [uapp.finished.s(job, tag, 0.0), uapp.finished.s(other, tag, 0.0)]
    outcome = group(members).delay().get(timeout=10, propagate=False)
    assert isinstance(outcome[0], AlreadyQueued) and outcome[0].task_id == holder.id
    assert outcome[1]["fence"] is not None
    body = chord(
        [uapp.finished.s(job, tag, 0.0), uapp.finished.s(uniq("grp"), tag, 0.0)],
        capp.lt_rec.s(tag=tag, label="body"),
    ).delay()
    with pytest.raises(Exception) as err:  # the chord's body learns of it: ChordError
        body.get(timeout=10)
    assert holder.id in str(err.value)
    holder.get(timeout=10)


def test_a_failed_send_lets_the_key_go(uapp: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from celery import Task

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("broker down")

    job, tag = uniq("down"), uniq("down")
    monkeypatch.setattr(Task, "apply_async", broken)
    with pytest.raises(ConnectionError):
        uapp.finished.delay(job, tag)
    assert uapp.finished.unique_holder(job, tag) is None


def test_a_worker_runs_every_accepted_job_once(
    worker: Worker, uapp: ModuleType, rec: redis.Redis
) -> None:
    """Eight keys, each published ten times: eight runs, one per key.  A key's
    ten publishes go back to back, and its run lasts longer than they take,
    however loaded the machine: each key is queued or running meanwhile."""
    tag = uniq("many")
    jobs = [uniq("job") for _ in range(8)]
    results = [uapp.finished.delay(j, tag, 1.0) for j in jobs for _ in range(10)]
    assert len({r.id for r in results}) == 8
    for r in results:
        r.get(timeout=20)
    ran = wait_runs(rec, tag, 8, 10)
    assert sorted(r["job"] for r in ran) == sorted(jobs)
