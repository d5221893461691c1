"""The lock store goes away and comes back, under real prefork workers, for each
``lock_on_redis_error`` policy: what docs/guarantees.md's table says.

The broker, the results and the recordings stay on the session's Redis; the
locks are on a private redis-server of this module (AOF, a password), which
the tests stop (SIGKILL) and start again on the same port.  One worker per
policy (``retry`` with ``redislock_redis_error_retries=2``, ``fail``,
``run``), each on a queue of its own, all started while the store is down.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis

from celery_redislock import BackendUnavailable, config
from celery_redislock.primitives import keys
from tests.helpers import report, wait_until
from tests.integration.task_helpers import (
    listed,
    lock_key,
    runs,
    stop_all,
    uniq,
    wait_runs,
    wait_started,
)
from tests.redis_server import RedisServer, free_port
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.fault, pytest.mark.slow]

POLICIES = ("retry", "fail", "run")
#: The store's password: it must never reach a log.
PASSWORD = "outage-s3cret"
#: redislock_redis_error_retries of the workers.
RETRIES = 2


@pytest.fixture(scope="module")
def store() -> Iterator[RedisServer]:
    """The lock store: not started yet (the workers start without it)."""
    server = RedisServer(
        port=free_port(),  # (given: never moved to another port)
        extra=["--requirepass", PASSWORD, "--appendonly", "yes", "--appendfsync", "always"],
    )
    server.ping_options = {"password": PASSWORD}
    yield server
    server.stop()


def up(store: RedisServer) -> redis.Redis:
    """Start the store if it is down; a client of it."""
    if store.proc is None:
        store.start()
    return redis.Redis(port=store.port, password=PASSWORD)


@pytest.fixture(scope="module")
def workers(redis_base: str, store: RedisServer) -> Iterator[dict[str, Worker]]:
    """One worker per policy, started (in parallel) while the store is down."""
    url = f"redis://:{PASSWORD}@127.0.0.1:{store.port}/0"
    started = {
        policy: Worker(
            redis_base,
            concurrency=2,
            name=f"outage-{policy}",
            extra=["-Q", f"outage-{policy}"],
            env={
                "REDISLOCK_TEST_LOCK_URL": url,
                "REDISLOCK_TEST_CONF": json.dumps(
                    {
                        "redislock_on_redis_error": policy,
                        "redislock_redis_error_retries": RETRIES,
                        "redislock_socket_timeout": 2.0,
                    }
                ),
            },
        )
        for policy in POLICIES
    }
    try:
        for w in started.values():
            w.wait_ready()
        yield started
    finally:
        stop_all(started.values())
    for w in started.values():
        assert PASSWORD not in w.output()


def send(capp: ModuleType, policy: str, job: str, tag: str, duration: float, **options: Any) -> Any:
    return capp.lt_fail.apply_async(
        (job, tag, duration), queue=f"outage-{policy}", redislock=options or None
    )


def fence_key(task: Any, job: str) -> str:
    name = task.lock_name_for((job, ""), {})
    return keys.lock_keys(config.settings_for(task.app).key_prefix, name).fence


#: What the start-up ERROR says each policy does to runs.
SAYS = {
    "retry": f"is re-sent up to {RETRIES} times, 0.05-0.4 s apart, then fails with "
    "BackendUnavailable (redislock_on_redis_error='retry')",
    "fail": "fails at once with BackendUnavailable (redislock_on_redis_error='fail')",
    "run": "runs its body WITHOUT a lock (redislock_on_redis_error='run')",
}


def test_a_worker_started_without_its_store_says_so_once_and_what_runs_will_do(
    workers: dict[str, Worker], store: RedisServer
) -> None:
    for policy, w in workers.items():
        lines = [x for x in w.output().splitlines() if "celery_redislock: lock store" in x]
        assert len(lines) == 1, lines
        (line,) = lines
        assert "ERROR/MainProcess" in line, line
        assert (
            f"lock store redis://127.0.0.1:{store.port}/0 (from redislock_url) is unreachable ("
            in line
        )
        assert "the worker starts anyway" in line and SAYS[policy] in line, line
        assert "reached" not in line


def test_runs_sent_while_the_store_is_down(
    workers: dict[str, Worker], store: RedisServer, capp: ModuleType, rec: redis.Redis
) -> None:
    """retry: re-sent RETRIES times, then FAILURE; fail: FAILURE at once; run:
    the body runs once, without a lock.  Then a retried run whose store comes
    back runs once, with its lock."""
    store.kill()
    tags = {p: uniq("outage-down") for p in POLICIES}
    t0 = time.monotonic()
    results = {p: send(capp, p, uniq("outage-job"), tags[p], 0.0) for p in POLICIES}
    # retry: the store comes back while it is re-sent (enough re-sends for that).
    back_tag, back_job = uniq("outage-back"), uniq("outage-job")
    back = send(capp, "retry", back_job, back_tag, 0.0, lock_redis_error_retries=50)

    with pytest.raises(BackendUnavailable) as failed:
        results["fail"].get(timeout=10)
    fail_s = time.monotonic() - t0
    assert "unreachable" in str(failed.value)
    assert results["run"].get(timeout=10) == {"fence": None, "id": results["run"].id}
    with pytest.raises(BackendUnavailable) as retried:
        results["retry"].get(timeout=20)
    assert f"still unreachable after {RETRIES} re-sends (lock_redis_error_retries={RETRIES})" in (
        str(retried.value)
    )
    resends = [s for s in listed(rec, "retry_signals") if s["id"] == results["retry"].id]
    assert len(resends) == RETRIES, resends
    assert runs(rec, tags["retry"]) == [] and runs(rec, tags["fail"]) == []
    (ran,) = runs(rec, tags["run"])
    assert ran["fence"] is None  # no lock

    wait_until(
        lambda: any(s["id"] == back.id for s in listed(rec, "retry_signals")),
        10,
        what="a re-send while the store is down",
    )
    store.start()
    assert back.get(timeout=20)["fence"] is not None
    (back_run,) = wait_runs(rec, back_tag, 1, 5)
    back_resends = [s for s in listed(rec, "retry_signals") if s["id"] == back.id]
    report("store_down_runs", fail_s=fail_s, retried_until_back=len(back_resends))
    assert fail_s < 5.0, fail_s

    # Back: a run on every worker takes its lock, once, and frees it.
    again = {p: (uniq("outage-job"), uniq("outage-again")) for p in POLICIES}
    for p, (job, tag) in again.items():
        assert send(capp, p, job, tag, 0.0).get(timeout=10)["fence"] is not None
        assert len(runs(rec, tag)) == 1
    time.sleep(0.5)
    assert runs(rec, back_tag) == [back_run]  # each ran once, never again
    assert runs(rec, tags["run"]) == [ran]


def test_the_store_goes_away_while_runs_hold_their_locks(
    workers: dict[str, Worker], store: RedisServer, capp: ModuleType, rec: redis.Redis
) -> None:
    """Every policy alike (the lock was taken): the keeper cannot renew, the
    lease is reported lost (lock_lost) once the lock's ttl has passed, and the
    body runs on to its end, once: its outcome stands.  Its release then
    finds the lease gone (LockLost, logged, lock_lost again) when the store is
    back, or cannot reach the store (logged; it frees by its lease).  Nothing
    is left held once the store is back; the next run takes the lock."""
    locks = up(store)
    ttl = 2.0
    long_runs = {p: (uniq("outage-job"), uniq("outage-held"), 5.0) for p in POLICIES}
    short_runs = {p: (uniq("outage-job"), uniq("outage-short"), 0.6) for p in POLICIES}
    results = {}
    for plan in (long_runs, short_runs):
        for p, (job, tag, duration) in plan.items():
            results[tag] = send(capp, p, job, tag, duration, lock_ttl=ttl)
    for plan in (long_runs, short_runs):
        for job, tag, _ in plan.values():
            wait_started(rec, tag)
            assert locks.exists(lock_key(capp.lt_fail, (job, tag)))
    locks.close()

    store.kill()
    killed = time.time()
    # The short bodies end within their lease (lost at the earliest a lease
    # less one renewal interval after the kill); the long ones after the restart.
    time.sleep(3.0)
    locks = up(store)
    for plan in (long_runs, short_runs):
        for job, tag, _ in plan.values():
            assert results[tag].get(timeout=10)["id"] == results[tag].id  # SUCCESS
            assert len(runs(rec, tag)) == 1
            assert not locks.exists(lock_key(capp.lt_fail, (job, tag)))  # nothing left held
    lost = [e for e in listed(rec, "lock_lost") if e["at"] > killed]
    for p, w in workers.items():
        log = w.output()
        job, tag, _ = long_runs[p]
        # Held past its lease: reported lost by the keeper, and by its release.
        reasons = [e["reason"] for e in lost if e["key"] == lock_key(capp.lt_fail, (job, tag))]
        assert len(reasons) == 2, (p, reasons)
        assert reasons[0].startswith("no renewal succeeded within the lease (2 s)"), reasons
        assert "had expired before release" in reasons[1], reasons
        assert f"{results[tag].id}]: lock 'lt.fail:" in log, p
        assert "cannot renew 1 lease(s)" in log, p
        # Ended within its lease, while the store was down: not lost; its
        # release is logged as failed, and the lease ends by itself.
        job, tag, _ = short_runs[p]
        assert [e for e in lost if e["key"] == lock_key(capp.lt_fail, (job, tag))] == [], p
        assert f"{results[tag].id}]: could not release " in log, p
        assert "it frees when its lease ends" in log, p
        # The store kept its data (AOF): the lock key went by its lease, not the restart.
        assert locks.exists(fence_key(capp.lt_fail, job)), p

    # Back: the next run of each job takes the lock, with a higher fence.
    for p, (job, held_tag, _) in long_runs.items():
        (held,) = runs(rec, held_tag)
        after = send(capp, p, job, uniq("outage-after"), 0.0).get(timeout=10)
        assert after["fence"] > held["fence"], (p, after, held)
    locks.close()
