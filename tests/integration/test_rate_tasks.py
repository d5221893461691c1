"""Global rate limits on real prefork workers: starts per second across two
``celery -A tests.rates_app worker -P prefork -c 4`` subprocesses.

Bodies record their start (wall clock: the processes share the machine's);
``task_prerun`` records every delivery of a message, so each test also
counts how often a run was sent.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from celery_redislock import ConfigurationError, LockedTask, RateLimited, TaskSkipped
from tests.helpers import intervals, peak_overlap
from tests.integration.task_helpers import (
    base_of,
    flush_state,
    listed,
    pointed,
    stop_all,
    uniq,
    wait_runs,
)
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]


@pytest.fixture(scope="module")
def app(redis_url: str) -> Any:
    from tests import rates_app

    return pointed(rates_app.app, redis_url)


@pytest.fixture(scope="module")
def workers(redis_url: str, app: Any) -> Iterator[list[Worker]]:
    """Two prefork workers of four processes each, every process warmed up."""
    flush_state(redis_url)
    base = base_of(redis_url)
    started = [Worker(base, app="tests.rates_app", name=f"rates-{n}", concurrency=4) for n in "ab"]
    try:
        for w in started:
            w.wait_ready()
        tag = uniq("warm")
        warm = [app.signature("r.wait", (tag, i)).apply_async() for i in range(8)]
        for result in warm:
            result.get(timeout=30)
        yield started
    finally:
        stop_all(started)


def send(app: Any, name: str, *args: Any, **options: Any) -> Any:
    return app.signature(name, args).apply_async(**options)


def starts(records: Sequence[dict[str, Any]]) -> list[float]:
    return sorted(r["start"] for r in records)


def busiest_second(times: Sequence[float]) -> int:
    """The most starts in any window of one second (both ends included)."""
    times = sorted(times)
    return max(sum(1 for t in times[i:] if t <= start + 1.0) for i, start in enumerate(times))


def deliveries(rec: redis.Redis, tag: str) -> Counter[str]:
    """How many times each run's message reached a pool process."""
    return Counter(d["id"] for d in listed(rec, f"deliveries:{tag}"))


def test_thirty_runs_at_five_a_second_on_two_workers(
    app: Any, rec: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("five")
    sent_at = time.time()
    results = [send(app, "r.five", tag, i) for i in range(30)]
    for result in results:
        result.get(timeout=30)
    records = wait_runs(rec, tag, 30, 5)
    times = starts(records)
    # Every run exactly once.
    assert Counter(r["seq"] for r in records) == Counter(range(30))
    # At most 5 starts (plus the one at the window's edge) in any second.
    assert busiest_second(times) <= 6, times
    # The last starts near its slot (29 intervals of 200 ms after the first):
    # no blind backoff stretches the drain.
    span = times[-1] - times[0]
    assert 29 * 0.2 * 0.97 <= span <= 29 * 0.2 * 1.1, span
    assert times[0] - sent_at < 1.0
    # A deferred run is sent once more, to its slot, never again.
    sends = deliveries(rec, tag)
    assert len(sends) == 30 and max(sends.values()) <= 2, sends
    assert sum(1 for n in sends.values() if n == 2) >= 20


def test_a_group_holds_the_combined_rate_of_its_tasks(
    app: Any, rec: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("group")
    results = [send(app, "r.group_a" if i % 2 else "r.group_b", tag, i) for i in range(12)]
    for result in results:
        result.get(timeout=30)
    records = wait_runs(rec, tag, 12, 5)
    times = starts(records)
    assert Counter(r["which"] for r in records) == {"a": 6, "b": 6}
    # redislock_rate_limits={"shared": "4/s"} for both tasks together.
    assert busiest_second(times) <= 5, times
    assert times[-1] - times[0] >= 11 * 0.25 * 0.97


def test_per_key_limits_are_independent(app: Any, rec: redis.Redis, workers: list[Worker]) -> None:
    tag = uniq("key")
    backlog = [send(app, "r.per_user", tag, "busy", i) for i in range(8)]
    time.sleep(0.3)  # the busy user's backlog is deferred by now
    sent = time.time()
    other = send(app, "r.per_user", tag, "other", 100)
    other_start = other.get(timeout=10)
    # One user's backlog (2/s: its last slot 3.5 s away) does not delay another's.
    assert other_start - sent < 0.5
    for result in backlog:
        result.get(timeout=30)
    records = wait_runs(rec, tag, 9, 5)
    busy = starts([r for r in records if r["user"] == "busy"])
    assert busiest_second(busy) <= 3
    assert busy[-1] - busy[0] >= 7 * 0.5 * 0.97


def test_skip_and_fail_end_visibly_at_once(
    app: Any, rec: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("ends")
    for name, error in (("r.skip", TaskSkipped), ("r.fail", RateLimited)):
        first = send(app, name, tag, 0)
        first.get(timeout=10)
        began = time.monotonic()
        second = send(app, name, tag, 1)
        with pytest.raises(error) as caught:
            second.get(timeout=10)
        assert time.monotonic() - began < 3.0
        assert second.state == "FAILURE"
        if error is RateLimited:
            assert 50 < caught.value.delay <= 60, caught.value.delay
    records = wait_runs(rec, tag, 2, 5)
    assert sorted(r["seq"] for r in records) == [0, 0]
    assert len(deliveries(rec, tag)) == 4  # nothing re-sent


def test_wait_sleeps_in_the_worker_until_the_slot(
    app: Any, rec: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("wait")
    results = [send(app, "r.wait", tag, i) for i in range(6)]
    for result in results:
        result.get(timeout=30)
    times = starts(wait_runs(rec, tag, 6, 5))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0.1 * 0.9, gaps  # 10/s: one start per 100 ms
    assert set(deliveries(rec, tag).values()) == {1}  # waited, never re-sent


def test_a_rate_and_a_lock_both_hold(app: Any, rec: redis.Redis, workers: list[Worker]) -> None:
    tag = uniq("both")
    results = [send(app, "r.locked", tag, "one-job", i, 0.1) for i in range(10)]
    for result in results:
        result.get(timeout=60)
    records = wait_runs(rec, f"{tag}:end", 10, 10)
    spans = intervals([{**r, "start": r["start"], "end": r["end"]} for r in records])
    assert Counter(r["seq"] for r in records) == Counter(range(10))
    assert peak_overlap(spans) == 1  # the lock: one at a time
    assert busiest_second(starts(records)) <= 6  # the rate: 5/s
    fences = [r["fence"] for r in sorted(wait_runs(rec, tag, 10, 1), key=lambda r: r["start"])]
    assert fences == sorted(fences)


def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def test_a_locked_run_takes_its_start_with_its_lock_in_one_call(
    app: Any, redis_url: str, workers: list[Worker]
) -> None:
    server = redis.Redis.from_url(redis_url)
    send(app, "r.locked", uniq("warm"), "warm", 0, 0.0).get(timeout=10)
    time.sleep(0.25)
    before = evalsha_calls(server)
    for i in range(4):  # one at a time, each within the rate: none over it
        send(app, "r.locked", uniq("trips"), f"job-{i}", i, 0.0).get(timeout=10)
        time.sleep(0.25)
    # Per run: the acquire (carrying the start) and the release; nothing else.
    assert evalsha_calls(server) - before == 4 * 2
    server.close()


def test_a_rate_alone_takes_no_lock(app: Any, rec: redis.Redis, workers: list[Worker]) -> None:
    tag = uniq("nolock")
    results = [send(app, "r.five", tag, i, 1.0) for i in range(3)]
    for result in results:
        result.get(timeout=30)
    records = wait_runs(rec, tag, 3, 5)
    times = starts(records)
    # Three bodies of a second each, started 200 ms apart: they overlap.
    assert times[-1] - times[0] < 1.0


# -- options, checked at class creation ----------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"global_rate_limit": "5/x"}, "global_rate_limit"),
        ({"global_rate_limit": 0}, "global_rate_limit"),
        ({"global_rate_limit": -3}, "global_rate_limit"),
        ({"rate_limit_group": "nope"}, "nope"),
        ({"global_rate_limit": "5/s", "rate_limit_group": "shared"}, "rate_limit_group"),
        ({"rate_limit_key": ["user"]}, "rate_limit_key"),
        ({"global_rate_limit": "5/s", "rate_limit_key": ["nobody"]}, "nobody"),
        ({"global_rate_limit": "5/s", "on_rate_limited": "later"}, "on_rate_limited"),
        ({"global_rate_limit": "5/s", "rate_limit_keys": ["user"]}, "rate_limit_keys"),
    ],
)
def test_bad_options_fail_at_class_creation(app: Any, options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError) as caught:

        @app.task(name=f"r.bad_{uniq()}", base=LockedTask, shared=False, **options)
        def bad(user: str) -> None: ...

        bad._get_current_object() if hasattr(bad, "_get_current_object") else None
        app.tasks[bad.name]
    message = str(caught.value)
    assert "r.bad_" in message and named in message, message


def test_a_bad_rate_limits_setting_names_the_group() -> None:
    from celery_redislock.config import check_rate_limits

    with pytest.raises(ConfigurationError, match=r"redislock_rate_limits\['stripe'\].*'5/x'"):
        check_rate_limits({"stripe": "5/x"}, "redislock_rate_limits")
