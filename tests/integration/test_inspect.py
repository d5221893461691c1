"""The inspect API against a real prefork worker (tests.limits_app) and a real Redis.

Holders are named from their tokens alone: the task id, task name, worker
node name and pid the worker's own run recorded must be what the API shows.
Freeing a name raises its fence: the next run's fence is above it, and the
old holder's own release finds its lease gone (``LockLost``, in the worker's
log).  Round trips are counted client-side.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_redislock import Lock, Semaphore
from celery_redislock.inspect import Inspector, Kind
from celery_redislock.ops import reading
from celery_redislock.primitives import keys
from tests.helpers import counting_client, wait_until
from tests.integration.task_helpers import (
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
def worker(redis_url: str, app: Any) -> Iterator[Worker]:
    with limits_workers(redis_url, ["insp"]) as started:
        yield started[0]


@pytest.fixture
def inspector(app: Any) -> Inspector:
    return Inspector.from_app(app)


def one(entries: list[Any]) -> Any:
    assert len(entries) == 1, entries
    return entries[0]


def test_a_running_task_is_shown_with_its_task_worker_and_pid(
    worker: Worker, app: Any, inspector: Inspector, rec: redis.Redis
) -> None:
    job, tag = uniq("insp"), uniq("insp")
    result = app.tasks["l.park"].delay(job, tag, 1.5)
    entry = wait_until(lambda: inspector.entries(pattern=f"*{job}*"), 10, what="listed")[0]
    assert entry.kind is Kind.LOCK and entry.name == f'l.park:["{job}"]'
    (holder,) = entry.holders
    assert holder.task_id == result.id
    assert holder.task_name == "l.park"
    assert holder.hostname == f"{worker.name}@{socket.gethostname()}"
    assert holder.fence == entry.fence and 0 < holder.ttl_ms <= 5000
    assert holder.held_ms is not None and 0 <= holder.held_ms < 5000
    result.get(timeout=10)
    (ran,) = runs(rec, tag)
    assert holder.pid == ran["pid"] and holder.fence == ran["fence"]
    assert inspector.entries(pattern=f"*{job}*") == []  # released: nothing left to list


def test_semaphore_permits_and_a_waiter(
    worker: Worker, app: Any, inspector: Inspector, rec: redis.Redis
) -> None:
    tag = uniq("sem")
    results = [app.tasks["l.sem3"].delay(tag, 1.5, seq=i) for i in range(4)]
    entry = wait_until(
        lambda: [
            e for e in inspector.entries(kind="semaphore") if len(e.holders) == 3 and e.waiters
        ],
        10,
        what="three permits held and one waiter",
    )[0]
    assert entry.limit == 3 and entry.waiters == 1 and entry.parked == 0
    assert {h.task_id for h in entry.holders} < {r.id for r in results}
    assert all(h.mode == "permit" and h.task_name == "l.sem3" for h in entry.holders)
    (waiter,) = inspector.waiters(entry)
    assert waiter.task_id in {r.id for r in results} - {h.task_id for h in entry.holders}
    for r in results:
        r.get(timeout=20)
    assert len(runs(rec, tag)) == 4


def test_read_write_lock_readers_and_a_waiting_writer(
    worker: Worker, app: Any, inspector: Inspector, rec: redis.Redis
) -> None:
    tag = uniq("rw")
    readers = [app.tasks["l.read"].delay(tag, 1.5, seq=i) for i in range(2)]
    wait_until(
        lambda: [e for e in inspector.show("dataset", "rwlock") if len(e.holders) == 2],
        10,
        what="two readers",
    )
    writer = app.tasks["l.write"].delay(tag, 0.1)
    entry = wait_until(
        lambda: [e for e in inspector.show("dataset", "rwlock") if e.writers_waiting], 10
    )[0]
    assert {h.mode for h in entry.holders} == {"read"}
    assert {h.task_id for h in entry.holders} == {r.id for r in readers}
    assert entry.writers_waiting == 1 and entry.waiters == 1
    writer.get(timeout=20)
    assert len(runs(rec, tag)) == 3


def test_parked_runs_in_line_then_drop_one_and_republish_another(
    worker: Worker, app: Any, inspector: Inspector, locks: redis.Redis, rec: redis.Redis
) -> None:
    job, tag = uniq("park"), uniq("park")
    task = app.tasks["l.park"]
    name = task.lock_name_for((job, tag), {})
    lock = Lock(locks, name, ttl=30, renew=False)
    assert lock.acquire(blocking=False)
    sent = []
    for seq in range(3):
        sent.append(task.delay(job, tag, 0.0, seq=seq))
        wait_until(lambda n=seq + 1: len(inspector.parked(name)) == n, 10, what="parked")
    parked = inspector.parked(name)
    assert [p.task_id for p in parked] == [r.id for r in sent]
    assert [p.position for p in parked] == [0, 1, 2]
    assert all(p.task_name == "l.park" and not p.in_flight for p in parked)
    entry = one(inspector.show(name))
    assert entry.parked == 3 and entry.waiters == 0 and entry.holders[0].token == lock.token
    assert f"lock:{name}" in [i for i, _ in inspector.parked_index()]

    dropped = inspector.drop_parked(parked[1].id)
    assert dropped is not None and dropped.task_id == sent[1].id
    assert sent[1].state == "REVOKED"  # it never runs: its result says so
    assert inspector.drop_parked(parked[1].id) is None  # gone
    assert [p.task_id for p in inspector.parked(name)] == [sent[0].id, sent[2].id]

    # Re-published while the lock is still held: it contends again, and parks
    # again, in its old place (its publish time), under a new parked token.
    new_id = inspector.republish_parked(parked[2].id)
    assert new_id == sent[2].id
    again = wait_until(
        lambda: [
            p for p in inspector.parked(name) if p.task_id == sent[2].id and p.id != parked[2].id
        ],
        10,
        what="parked again",
    )
    assert [p.task_id for p in inspector.parked(name)] == [sent[0].id, sent[2].id]
    assert again[0].position == 1

    released = inspector.release(name)  # the parked runs it grants are re-published
    assert released[0].freed[0].token == lock.token
    wait_runs(rec, tag, 2, 20)
    assert sorted(r["seq"] for r in runs(rec, tag)) == [0, 2]  # the dropped run never ran
    assert inspector.show(name) == []


def test_release_frees_a_running_task_and_raises_the_fence(
    worker: Worker, app: Any, inspector: Inspector, rec: redis.Redis
) -> None:
    job, tag = uniq("rel"), uniq("rel")
    task = app.tasks["l.park"]
    name = task.lock_name_for((job, tag), {})
    first = task.delay(job, tag, 2.0, seq=0)
    entry = wait_until(lambda: inspector.show(name), 10, what="held")[0]
    old = entry.holders[0]
    (released,) = inspector.release(name)
    assert [h.token for h in released.freed] == [old.token] and released.fence > old.fence
    second = task.delay(job, tag, 0.0, seq=1)
    second.get(timeout=10)
    first.get(timeout=10)
    by_seq = {r["seq"]: r for r in runs(rec, tag)}
    assert by_seq[1]["fence"] > released.fence > by_seq[0]["fence"]
    assert by_seq[1]["end"] < by_seq[0]["end"]  # ran while the freed holder still ran
    # The old holder learns it lost the lock: its renewal or its release
    # finds the lease gone, and its log line says so.
    wait_until(
        lambda: [
            line
            for line in worker.output().splitlines()
            if first.id in line and ("expired before release" in line or "lost" in line)
        ],
        10,
        what="the old holder's loss in the worker's log",
    )


def test_unique_keys_listed_and_let_go(uapp: ModuleType, inspector: Inspector) -> None:
    job, tag = uniq("uq"), uniq("uq")
    queued = uapp.finished.apply_async((job, tag), queue="redislock-nobody")
    parsed = reading.parse(inspector.prefix, uapp.finished.unique_key_for((job, tag), {}))
    assert parsed is not None
    name = parsed[0]
    entry = one(inspector.show(name, "unique"))
    assert entry.unique is not None and entry.unique.waiting == queued.id
    assert 0 < entry.unique.waiting_ttl_ms <= 3600_000 and entry.held
    assert name in [e.name for e in inspector.entries(kind="unique")]
    (released,) = inspector.release(name, "unique")
    assert released.unique_job == queued.id and released.fence is None
    assert uapp.finished.unique_holder(job, tag) is None
    redis.Redis.from_url(uapp.app.conf.broker_url).delete("redislock-nobody")


def test_listing_reads_in_pipelines_and_scans_never_keys(
    redis_url: str, locks: redis.Redis
) -> None:
    prefix = uniq("scale")
    client, trips = counting_client(redis_url)
    held = [Lock(client, f"n{i}", prefix=prefix, ttl=60) for i in range(1200)]
    pipe = locks.pipeline(transaction=False)
    for lock in held:
        k = keys.lock_keys(prefix, lock.name)
        pipe.set(k.lock, f"tok{lock.name}", px=60000)
        pipe.set(k.fence, "1", px=60000)
    sem = Semaphore(locks, "api", 2, prefix=prefix)
    sem.acquire()
    pipe.execute()
    inspector = Inspector(client, prefix)
    trips.reset()
    entries = inspector.entries()
    names = [c[0] for c in trips.names(handshake=False)]
    assert "KEYS" not in names
    scans = names.count("SCAN")
    assert scans >= 1 and len(names) == scans + 3  # 1201 names: three pipelines of 500
    assert len(entries) == 1201
    assert sum(e.kind is Kind.SEMAPHORE for e in entries) == 1
    assert [e.name for e in inspector.entries(pattern="n11*")] == sorted(
        ["n11", *(f"n11{i}" for i in range(10)), *(f"n11{i:02d}" for i in range(100))]
    )
    sem.release()
    client.close()


def test_a_digested_name_is_listed_and_released_by_its_digest(locks: redis.Redis) -> None:
    prefix = uniq("dig")
    name = "x" * 300
    lock = Lock(locks, name, prefix=prefix)
    assert lock.acquire(blocking=False)
    inspector = Inspector(locks, prefix)
    entry = one(inspector.entries())
    assert entry.name == "#" + keys.digest(name) and entry.holders[0].token == lock.token
    assert one(inspector.show(name)).key == one(inspector.show(entry.name)).key == entry.key
    (released,) = inspector.release(entry.name)
    assert released.freed[0].token == lock.token
    assert not locks.exists(keys.lock_keys(prefix, name).lock)
    assert reading.parse(prefix, keys.lock_keys(prefix, name).queue) == (
        entry.name,
        Kind.LOCK,
        "queue",
    )


def test_release_of_one_holder_leaves_the_others(locks: redis.Redis) -> None:
    prefix = uniq("one")
    permits = [Semaphore(locks, "pool", 3, prefix=prefix, renew=False) for _ in range(3)]
    for p in permits:
        assert p.acquire(blocking=False)
    inspector = Inspector(locks, prefix)
    (released,) = inspector.release("pool", holder=permits[1].token)
    assert [h.token for h in released.freed] == [permits[1].token]
    entry = one(inspector.show("pool"))
    assert {h.token for h in entry.holders} == {permits[0].token, permits[2].token}
    assert entry.fence == released.fence  # raised, and no grant since
    for p in (permits[0], permits[2]):
        p.release()


def test_a_re_published_parked_run_is_shown_with_its_own_worker_and_pid(
    worker: Worker, app: Any, inspector: Inspector, locks: redis.Redis, rec: redis.Redis
) -> None:
    job, tag = uniq("rep"), uniq("rep")
    task = app.tasks["l.park"]
    name = task.lock_name_for((job, tag), {})
    lock = Lock(locks, name, ttl=30, renew=False)
    assert lock.acquire(blocking=False)
    result = task.delay(job, tag, 1.5)
    (parked,) = wait_until(lambda: inspector.parked(name), 10, what="parked")
    inspector.release(name)  # hands over, and re-publishes the parked run
    holder = wait_until(
        lambda: [h for e in inspector.show(name) for h in e.holders if h.token != parked.id],
        10,
        what="the re-published run holding under its own token",
    )[0]
    assert holder.task_id == result.id and not holder.parked
    assert holder.hostname == f"{worker.name}@{socket.gethostname()}"
    result.get(timeout=10)
    (ran,) = runs(rec, tag)
    assert holder.pid == ran["pid"] and holder.fence == ran["fence"]
    assert inspector.show(name) == []
