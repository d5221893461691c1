"""on_contention="park" on real prefork workers: drain rate, order, identity, crashes, duplicates.

A parked run leaves its message in the lock's FIFO queue in Redis and ends;
the release that grants it re-publishes the message.  Bodies record their
start and end (monotonic clock) in Redis: runs are counted there, not from
results (a killed process's run is recorded, while its result says
WorkerLostError).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_redislock import PARKED, config
from celery_redislock.primitives import keys
from celery_redislock.tasks import parking as park
from tests.helpers import intervals, peak_overlap, report, wait_until
from tests.integration.task_helpers import (
    base_of,
    flush_state,
    limits_app,
    limits_workers,
    runs,
    stop_all,
    uniq,
    wait_runs,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

#: Reservation of a granted parked task (s), and the sweep interval of limits_app.
RESERVE = 1.0
SWEEP = 0.5
#: limits_app's redislock_lock_ttl.
LOCK_TTL = 5.0


@pytest.fixture(scope="module")
def app(redis_url: str) -> Any:
    return limits_app(redis_url)


@pytest.fixture(scope="module")
def workers(redis_url: str, app: Any, rec: redis.Redis) -> Iterator[list[Worker]]:
    """Two prefork workers of four processes each, every process warmed up."""
    flush_state(redis_url)
    env = {"REDISLOCK_TEST_PARK_RESERVE": str(RESERVE)}
    with limits_workers(redis_url, ["park-a", "park-b"], env=env) as started:
        # Imports, connections and script loads happen here, not in a measurement.
        tag = uniq("warm")
        for i in range(16):
            submit(app, "l.park", f"warm-{i}", tag, 0.02, i)
        wait_runs(rec, tag, 16, 30)
        yield started


def submit(app: Any, name: str, *args: Any, **options: Any) -> Any:
    return app.signature(name, args).apply_async(**options)


def lock_keys_of(app: Any, name: str, *args: Any) -> keys.LockKeys:
    """The keys of the Lock that task ``name`` takes for these arguments."""
    lock_name = app.tasks[name].lock_name_for(args, {})
    return keys.lock_keys(config.settings_for(app).key_prefix, lock_name)


def by_seq(records: list[dict[str, Any]]) -> Counter[int]:
    return Counter(r["seq"] for r in records)


# -- drain -------------------------------------------------------------------------------

DRAIN = 20
BODY = 0.2


def test_same_key_tasks_drain_at_serial_speed_in_submission_order(
    app: Any, rec: redis.Redis, locks: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("drain")
    k = lock_keys_of(app, "l.park", "drain", tag, BODY, 0)
    submitted = time.monotonic()
    results = [submit(app, "l.park", "drain", tag, BODY, 0)]
    # The first run holds the lock before the others arrive, so "first" is seq 0.
    wait_until(lambda: locks.exists(k.lock), 5, 0.002, "the first run to take the lock")
    results += [submit(app, "l.park", "drain", tag, BODY, i) for i in range(1, DRAIN)]
    wait_runs(rec, tag, DRAIN, 20)
    values = [r.get(timeout=10) for r in results]  # by the ids they were submitted with
    time.sleep(0.3)
    records = sorted(runs(rec, tag), key=lambda r: r["start"])

    assert by_seq(records) == Counter(range(DRAIN))  # each exactly once
    assert [r["seq"] for r in records] == list(range(DRAIN))  # in submission order
    assert peak_overlap(intervals(records)) == 1
    assert [r["id"] for r in records] == [r.id for r in results]
    fences = [v["fence"] for v in values]
    assert fences == sorted(fences) and len(set(fences)) == DRAIN
    drain = records[-1]["end"] - submitted
    gaps = [b["start"] - a["end"] for a, b in zip(records, records[1:])]
    first_start = records[0]["start"] - submitted
    gaps_ms = [round(g * 1000) for g in gaps]
    assert drain <= 1.1 * DRAIN * BODY, (
        f"drain {drain:.3f} s, first start {first_start:.3f} s, hand-overs {gaps_ms} ms"
    )
    assert locks.exists(k.lock, k.queue, k.meta, k.pmsg, k.inflight) == 0
    report(
        f"park drain {DRAIN} x {BODY} s, 2 workers -c 4",
        drain_s=drain,
        ratio=drain / (DRAIN * BODY),
        handover_median_ms=statistics.median(gaps) * 1000,
        handover_max_ms=max(gaps) * 1000,
        in_order=True,
    )


def test_parked_task_keeps_its_id_args_options_and_callbacks(
    app: Any, rec: redis.Redis, locks: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("keep")
    k = lock_keys_of(app, "l.park_probe", "keep", tag, 0.6)
    submit(app, "l.park_probe", "keep", tag, 0.6)
    wait_until(lambda: locks.exists(k.lock), 5, 0.002, "the holder to take the lock")
    task_id = f"keep-{tag}"
    parked = app.signature(
        "l.park_probe", ("keep", tag, 0.05), {"note": {"a": [1, 2]}}
    ).apply_async(
        task_id=task_id,
        headers={"x_trace": "trace-123"},
        link=app.signature("l.rec", kwargs={"tag": tag, "label": "callback"}),
        link_error=app.signature("l.rec", kwargs={"tag": tag, "label": "errback"}),
    )
    wait_until(lambda: locks.hlen(k.pmsg) == 1, 5, 0.01, "the second run to park")
    # Parking stored no outcome: the run is PARKED (test_park_state.py).
    wait_until(lambda: parked.state == PARKED, 5, 0.01, "the state PARKED")

    value = parked.get(timeout=10)
    assert value["extra"] == {"note": {"a": [1, 2]}}
    holder, run = _holder_and_run(rec, tag, task_id)
    assert run["start"] >= holder["end"]  # it waited for the holder
    assert run["id"] == task_id
    assert run["args"] == ["keep", tag, 0.05]
    assert run["kwargs"] == {"note": {"a": [1, 2]}}
    assert run["x_trace"] == "trace-123"
    assert [c["task"] for c in run["callbacks"]] == ["l.rec"]
    assert run["callbacks"][0]["kwargs"] == {"tag": tag, "label": "callback"}
    assert [c["kwargs"]["label"] for c in run["errbacks"]] == ["errback"]
    assert run["routing_key"] == holder["routing_key"]
    # The callback ran once, after the parked body, with its return value.
    callbacks = [r for r in runs(rec, tag) if r.get("label") == "callback"]
    assert len(callbacks) == 1
    assert callbacks[0]["at"] >= run["end"]
    assert callbacks[0]["value"] == value
    assert not [r for r in runs(rec, tag) if r.get("label") == "errback"]
    assert sum(1 for r in runs(rec, tag) if r.get("id") == task_id) == 1


def _holder_and_run(
    rec: redis.Redis, tag: str, task_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    records = wait_runs(rec, tag, 3, 5)  # holder, parked run, callback
    bodies = [r for r in records if "label" not in r]
    holder = next(r for r in bodies if r["id"] != task_id)
    run = next(r for r in bodies if r["id"] == task_id)
    return holder, run


def test_duplicate_deliveries_of_a_parked_message_run_it_once(
    app: Any, rec: redis.Redis, locks: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("dup")
    k = lock_keys_of(app, "l.park", "dup", tag, 0.8, 0)
    submit(app, "l.park", "dup", tag, 0.8, 0)
    wait_until(lambda: locks.exists(k.lock), 5, 0.002, "the holder to take the lock")
    second = submit(app, "l.park", "dup", tag, 0.1, 1)
    wait_until(lambda: locks.hlen(k.pmsg) == 1, 5, 0.01, "the second run to park")
    [(token, payload)] = locks.hgetall(k.pmsg).items()
    message = park.decode(payload)
    assert message["options"]["task_id"] == second.id
    assert message["options"]["headers"][park.PARK_HEADER] == token.decode()

    def logged(text: str) -> int:
        return sum(
            line.count(text)
            for w in workers
            for line in w.output().splitlines()
            if text != parked_line or "parked until it is released" in line
        )

    parked_line = f"l.park[{second.id}]: lock"
    dropped_line = "a second delivery of a parked run that already ran; dropped"
    dropped = logged(dropped_line)
    # Two more deliveries while it is parked: each takes its place again.
    for _ in range(2):
        app.signature(message).apply_async()
    wait_until(lambda: logged(parked_line) == 3, 5, 0.02, "both copies to be seen")
    # Two more after it ran: each is dropped.
    wait_runs(rec, tag, 2, 5)
    for _ in range(2):
        app.signature(message).apply_async()
    wait_until(lambda: logged(dropped_line) == dropped + 2, 5, 0.02, "both copies dropped")
    time.sleep(0.3)
    records = runs(rec, tag)
    assert by_seq(records) == {0: 1, 1: 1}
    holder, run = sorted(records, key=lambda r: r["seq"])
    assert run["id"] == second.id
    assert run["start"] >= holder["end"]  # no early copy ran it before its turn
    assert second.get(timeout=5)["fence"] > holder["fence"]
    assert locks.exists(k.lock, k.queue, k.meta, k.pmsg, k.inflight) == 0


# -- crash safety ------------------------------------------------------------------------

CRASH_TASKS = 6
#: The first run holds this long, so that every other run has parked before it releases.
CRASH_FIRST = 1.0


@pytest.fixture(scope="module")
def crash_run(redis_url: str, app: Any, rec: redis.Redis) -> dict[str, Any]:
    """Park CRASH_TASKS same-key tasks on a worker whose every hand-over is killed.

    The faulty worker (REDISLOCK_FAULTS=before-park-publish) consumes queue
    park-crash: each release there takes the next parked task and SIGKILLs the
    pool process before re-publishing it.  Its own sweeper is idle; a second
    worker's process (which ran a park task, so it sweeps) recovers.
    """
    base = base_of(redis_url)
    faulty = Worker(
        base,
        app="tests.limits_app",
        name="park-faulty",
        concurrency=2,
        extra=["-Q", "park-crash"],
        env={
            "REDISLOCK_FAULTS": "before-park-publish",
            "REDISLOCK_TEST_PARK_RESERVE": str(RESERVE),
            "REDISLOCK_TEST_PARK_SWEEP": "3600",
        },
    )
    recoverer = Worker(
        base,
        app="tests.limits_app",
        name="park-recover",
        concurrency=1,
        extra=["-Q", "park-warm"],
        env={"REDISLOCK_TEST_PARK_RESERVE": str(RESERVE)},
    )
    try:
        faulty.wait_ready()
        recoverer.wait_ready()
        warm = uniq("warm")
        submit(app, "l.park", "warm", warm, 0.01, 0, queue="park-warm").get(timeout=20)
        tag = uniq("crash")
        k = lock_keys_of(app, "l.park", "crash", tag, BODY, 0)
        locks = redis.Redis.from_url(redis_url)
        submit(app, "l.park", "crash", tag, CRASH_FIRST, 0, queue="park-crash")
        wait_until(lambda: locks.exists(k.lock), 5, 0.002, "the first run to take the lock")
        for i in range(1, CRASH_TASKS):
            submit(app, "l.park", "crash", tag, BODY, i, queue="park-crash")
        wait_until(lambda: locks.hlen(k.pmsg) == CRASH_TASKS - 1, 5, 0.01, "the others to park")
        all_parked = time.monotonic()
        wait_runs(rec, tag, CRASH_TASKS, 45)
        time.sleep(RESERVE + SWEEP + 0.5)  # a run recovered twice would show up by now

        # billiard logs each dead child as its pool maintenance notices
        # (WorkerLostError only when the child died before the main process
        # had the run's result): give the last one a moment to be logged.
        def deaths() -> int:
            return faulty.output().count("exited with 'signal 9 (SIGKILL)'")

        kills = faulty.output().count("fault injection: killing pid")
        with contextlib.suppress(AssertionError):
            wait_until(lambda: deaths() >= kills, 5, 0.05, "every death logged")
        return {
            "records": sorted(runs(rec, tag), key=lambda r: r["start"]),
            "all_parked": all_parked,
            "kills": kills,
            "lost": deaths(),
            "left": locks.exists(k.lock, k.queue, k.meta, k.pmsg, k.inflight),
            "rec": rec,
        }
    finally:
        stop_all([faulty, recoverer])


@pytest.mark.fault
def test_killed_hand_overs_lose_no_task_and_run_none_twice(crash_run: dict[str, Any]) -> None:
    records = crash_run["records"]
    assert crash_run["all_parked"] < records[0]["end"]  # before the first hand-over
    assert by_seq(records) == Counter(range(CRASH_TASKS))  # none lost, none twice
    assert [r["seq"] for r in records] == list(range(CRASH_TASKS))
    assert peak_overlap(intervals(records)) == 1
    # Every hand-over was killed, and the main process saw each child die.
    assert crash_run["kills"] == CRASH_TASKS - 1
    assert crash_run["lost"] >= CRASH_TASKS - 1
    assert crash_run["left"] == 0
    stalls = [b["start"] - a["end"] for a, b in zip(records, records[1:])]
    assert len(stalls) == CRASH_TASKS - 1
    # Never re-published before its reservation lapsed (that could run it twice),
    # and never later than the lease the sweeper waits out plus one reservation.
    assert min(stalls) >= RESERVE - 0.05
    assert max(stalls) <= LOCK_TTL + RESERVE + SWEEP + 1.0
    report(
        f"park crash recovery, {CRASH_TASKS} tasks, reserve {RESERVE} s, sweep {SWEEP} s",
        kills=crash_run["kills"],
        stalls_s=[round(s, 3) for s in stalls],
    )


@pytest.mark.fault
def test_a_killed_hand_over_is_recovered_within_reserve_plus_sweep(
    crash_run: dict[str, Any],
) -> None:
    # From one run's end (its release hands over, and the pool process is
    # killed before re-publishing) to the sweeper publishing the next run's
    # message again.  (When a worker then fetches and runs it is up to that
    # worker: its prefetched messages of killed processes count against its
    # prefetch limit until its pool notices the deaths, which may take seconds;
    # the test above bounds that whole stall.)
    records = crash_run["records"]
    rec = crash_run["rec"]
    recovered = []
    for a, b in zip(records, records[1:]):
        sent = [float(t) for t in rec.lrange(f"published:{b['id']}", 0, -1)]
        recovered.append(min(t for t in sent if t >= a["end"]) - a["end"])
    assert len(recovered) == CRASH_TASKS - 1
    assert min(recovered) >= RESERVE - 0.05, recovered
    assert max(recovered) <= RESERVE + SWEEP + 0.5, recovered
    report(
        f"park crash re-publish, reserve {RESERVE} s, sweep {SWEEP} s",
        published_again_after_s=[round(r, 3) for r in recovered],
    )
