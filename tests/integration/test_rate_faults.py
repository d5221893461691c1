"""Deferred rate-limited runs across faults: none lost, none run twice.

A deferred run waits in the broker, as a message with a countdown to the
start slot it reserved (the Redis broker keeps it unacknowledged while a
worker holds it), not in the lock store.  So:

- a slot further away than half the broker's visibility timeout is reached
  in hops, so the broker never redelivers a message a worker still holds;
- a restart of the lock store (its own redis-server, without persistence)
  loses the limit's state, not the runs: the deferred ones are in the broker;
- a worker SIGKILLed while holding deferred runs leaves their messages
  unacknowledged; the broker gives them to the other worker once the
  visibility timeout has passed.

Two ``celery -A tests.rates_app worker -P prefork -c 4`` subprocesses serve
a queue of their own, with a visibility timeout of 2 s.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_redislock import config
from celery_redislock.testing.server import RedisServer
from tests.helpers import wait_until
from tests.integration.task_helpers import (
    base_of,
    flush_state,
    listed,
    stop_all,
    uniq,
    wait_runs,
)
from tests.integration.test_rate_tasks import busiest_second, deliveries, starts
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.fault]

QUEUE = "rates-faults"
VISIBILITY = 2.0
TRANSPORT = {
    "visibility_timeout": VISIBILITY,
    # kombu 5.7 sweeps unacknowledged messages every interval * throttle s;
    # older kombu every 10 s.
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}


@pytest.fixture(scope="module")
def store() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def app(redis_url: str, store: RedisServer) -> Iterator[Any]:
    from tests import rates_app

    base = base_of(redis_url)
    app = rates_app.app
    saved = {k: app.conf.get(k) for k in ("broker_url", "result_backend", "redislock_url")}
    saved_transport = app.conf.broker_transport_options
    app.conf.update(
        broker_url=f"{base}/1",
        result_backend=f"{base}/2",
        redislock_url=store.url,
        broker_transport_options=TRANSPORT,
    )
    config.reset(app)
    yield app
    app.conf.update(**saved, broker_transport_options=saved_transport)
    config.reset(app)


def worker(redis_url: str, store: RedisServer, name: str) -> Worker:
    conf = {"redislock_url": store.url, "broker_transport_options": TRANSPORT}
    return Worker(
        base_of(redis_url),
        app="tests.rates_app",
        name=name,
        concurrency=4,
        extra=["-Q", QUEUE],
        env={"REDISLOCK_TEST_CONF": json.dumps(conf)},
    )


@pytest.fixture(scope="module")
def workers(redis_url: str, store: RedisServer, app: Any) -> Iterator[list[Worker]]:
    flush_state(redis_url)
    started = [worker(redis_url, store, f"rates-faults-{n}") for n in "ab"]
    try:
        for w in started:
            w.wait_ready()
        tag = uniq("warm")
        for result in [send(app, "r.wait", tag, i) for i in range(8)]:
            result.get(timeout=30)
        yield started
    finally:
        stop_all(started)


def send(app: Any, name: str, *args: Any) -> Any:
    return app.signature(name, args).apply_async(queue=QUEUE)


def once_each(records: list[dict[str, Any]], n: int) -> None:
    assert Counter(r["seq"] for r in records) == Counter(range(n))
    assert len({r["id"] for r in records}) == n


def test_a_slot_beyond_the_visibility_timeout_is_reached_in_hops(
    app: Any, rec: redis.Redis, workers: list[Worker]
) -> None:
    tag = uniq("hops")
    n = 16  # at 5/s the last slot is 3 s away: past the 2 s visibility timeout
    results = [send(app, "r.five", tag, i) for i in range(n)]
    for result in results:
        result.get(timeout=30)
    time.sleep(VISIBILITY + 1.0)  # a redelivery would have happened by now
    records = wait_runs(rec, tag, n, 5)
    once_each(records, n)
    times = starts(records)
    assert busiest_second(times) <= 6, times
    assert times[-1] - times[0] <= (n - 1) * 0.2 * 1.1 + 0.2
    # Hops of at most half the visibility timeout: a run deferred d seconds
    # is sent 1 + ceil(d / 1 s) times, and the farthest ones more than twice.
    sends = deliveries(rec, tag)
    assert max(sends.values()) <= 1 + math.ceil((n - 1) * 0.2 / (VISIBILITY / 2))
    assert max(sends.values()) >= 3


def test_a_lock_store_restart_loses_no_deferred_run(
    app: Any, rec: redis.Redis, store: RedisServer, workers: list[Worker]
) -> None:
    # The worker said so as it started (from a thread of its own): the store
    # keeps no data on disk.
    said = wait_until(
        lambda: "the state of the rate limits of tasks" in workers[0].output(),
        timeout=10,
        what="the durability warning",
    )
    assert said and "r.five" in workers[0].output()
    tag = uniq("restart")
    n = 12
    results = [send(app, "r.five", tag, i) for i in range(n)]
    time.sleep(0.5)
    store.kill()  # SIGKILL, no persistence: the limit's state is gone
    store.start()
    for result in results:
        result.get(timeout=30)
    once_each(wait_runs(rec, tag, n, 5), n)


def test_a_killed_worker_loses_none_of_the_deferred_runs_it_held(
    app: Any,
    rec: redis.Redis,
    redis_url: str,
    store: RedisServer,
    workers: list[Worker],
) -> None:
    tag = uniq("kill")
    n = 6
    # At 1/s, starts fall on whole seconds from the first: the kill, half a
    # second in, lands between two of them, after every run was deferred (a
    # run the worker is executing when it dies is lost unless acks_late, as
    # for any Celery task).
    results = [send(app, "r.one", tag, i) for i in range(n)]
    wait_runs(rec, tag, 1, 5)
    time.sleep(0.5)
    assert len(deliveries(rec, tag)) == n
    victim, survivor = workers
    killed_at = time.time()
    victim.kill()
    victim.proc.wait(10)
    # The victim restarted by its supervisor, once the visibility timeout has
    # passed: a worker's broker connection restores the unacknowledged
    # messages older than that as it starts (kombu before 5.7 sweeps no more
    # often than every 100 s after that; 5.7 per unacked_restore_interval, so
    # there the survivor may get there first).
    time.sleep(VISIBILITY + 0.5)
    restarted = worker(redis_url, store, f"{victim.name}-again")
    try:
        restarted.wait_ready()
        for result in results:
            result.get(timeout=45)
    finally:
        restarted.stop()
    records = wait_runs(rec, tag, n, 5)
    once_each(records, n)
    # Runs the victim held (deferred, not yet started) ran after it died.
    seen = listed(rec, f"deliveries:{tag}")
    held = {d["id"] for d in seen if d["worker"].startswith(f"{victim.name}@")}
    late = {r["id"] for r in records if r["start"] > killed_at}
    assert held & late, (held, late)
    assert survivor.proc.poll() is None
