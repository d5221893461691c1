"""Parked runs across a lock store restart: how many run, how many are reported, none lost silently.

A parked run's message has one copy, in the lock store.  Each scenario parks
N runs behind a long holder, and QUIET runs of a task that stores no result
behind another, on a real prefork worker; SIGKILLs the lock store (its own
redis-server: the broker, the results and the recordings live on the
session's server) and restarts it on the same port with the same data
directory; then counts the runs that ran (recorded by their bodies), the ones
the worker reported as possibly lost (its ERROR line) and the rest: lost
silently.  Three stores, side by side (each with its own worker, consuming a
queue of its own), their runs parked one store after another, then the three
restarted:

- no persistence: the store comes back empty; the park sweeper of the process
  that parked them sees the store's epoch gone and re-publishes the runs whose
  result state is still PARKED;
- AOF, ``appendfsync everysec``, killed 1.5 s after the last park (past the
  fsync of every parked entry): the store reloads them;
- AOF with a replica and ``redislock_wait_replicas=1`` (every park waited for
  the replica): the master is the one killed and reloads from its AOF.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_redislock import Lock, config
from celery_redislock.primitives import keys
from tests.helpers import TcpProxy, report, wait_until
from tests.integration.task_helpers import limits_app, runs, stop_all, uniq
from tests.redis_server import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.fault]

N = 10
#: Parked runs of a task that stores no result (``ignore_result``): recovery
#: cannot tell whether they ran, so it reports them.
QUIET = 2
#: The holder's body: long enough to park N runs and restart the store under it.
HOLD = 4.0
AOF = ["--appendonly", "yes", "--appendfsync", "everysec"]


class Store:
    """The lock store: one redis-server on a fixed port, restarted in place."""

    def __init__(self, extra: list[str], replica: bool = False, proxied: bool = False) -> None:
        # Redis 7 waits 5 s before a diskless full sync (for more replicas to
        # join); this store's one replica syncs at once, and again after a restart.
        sync = ["--repl-diskless-sync-delay", "0"] if replica else []
        self.server = RedisServer(extra=[*extra, *sync]).start()
        self.client = redis.Redis(port=self.server.port)
        self.replica = None
        #: The replica's link to the master, when ``proxied`` (to stall it).
        self.proxy = TcpProxy("127.0.0.1", self.server.port) if proxied else None
        if replica:
            port = self.proxy.port if self.proxy is not None else self.server.port
            self.replica = RedisServer(extra=["--replicaof", "127.0.0.1", str(port)]).start()
            r = redis.Redis(port=self.replica.port)
            wait_until(lambda: r.info("replication").get("master_link_status") == "up", 10, 0.02)
            r.close()
            self.client.set("probe", 1)
            assert self.client.wait(1, 5000) == 1
            self.client.delete("probe")

    @property
    def url(self) -> str:
        return self.server.url

    def restart(self) -> None:
        self.server.kill()  # SIGKILL: no shutdown save
        self.server.start()

    def stop(self) -> None:
        self.client.close()
        if self.proxy is not None:
            self.proxy.close()
        if self.replica is not None:
            self.replica.stop()
        self.server.stop()


def start_worker(
    redis_base: str, store: Store, name: str, queue: str = "celery", **conf: Any
) -> Worker:
    """A tests.limits_app worker on ``queue`` whose lock store is ``store`` (not yet ready)."""
    settings = {"redislock_park_sweep_interval": 0.3, "redislock_park_reserve": 2.0, **conf}
    return Worker(
        redis_base,
        concurrency=3,
        app="tests.limits_app",
        name=f"{name}-{uniq()}",
        extra=["-Q", queue],
        env={"REDISLOCK_TEST_LOCK_URL": store.url, "REDISLOCK_TEST_CONF": json.dumps(settings)},
    )


def worker_for(redis_base: str, store: Store, name: str, **conf: Any) -> Worker:
    return start_worker(redis_base, store, name, **conf).wait_ready()


def reported_lost(worker: Worker) -> set[str]:
    """The task ids the worker's ERROR lines name as possibly lost."""
    found: set[str] = set()
    for line in worker.output().splitlines():
        m = re.search(r"parked run\(s\) may be lost.*?: ([0-9a-f, -]+)$", line)
        if m:
            found.update(i.strip() for i in m.group(1).split(",") if i.strip())
    return found


def park_behind_holders(app: Any, store: Store, queue: str) -> tuple[str, set[str]]:
    """Park N runs behind a holder (and QUIET runs that store no result behind
    another); returns their tag and task ids once every one is parked."""
    tag = uniq("durable")
    prefix = config.settings_for(app).key_prefix
    sent, queues = [], []
    for name, count in (("l.park", N), ("l.park_quiet", QUIET)):
        task, job = app.tasks[name], uniq("job")
        lock = keys.lock_keys(prefix, task.lock_name_for((job, tag, 0.05), {}))
        task.apply_async((job, f"{tag}-holder", HOLD), queue=queue)
        wait_until(lambda k=lock.lock: store.client.exists(k), 10, 0.02, "the holder")
        sent += [task.apply_async((job, tag, 0.05), queue=queue) for _ in range(count)]
        queues.append((lock.pmsg, count))
    for pmsg, count in queues:
        wait_until(lambda k=pmsg, c=count: store.client.hlen(k) == c, 10, 0.02, "runs to park")
    return tag, {r.id for r in sent}


def outcome(
    rec: redis.Redis, worker: Worker, tag: str, ids: set[str], until: float
) -> dict[str, int]:
    """After the restart: how many of the parked runs ran, were reported lost, or neither."""
    while time.monotonic() < until:
        ran = {r["id"] for r in runs(rec, tag)} & ids
        if len(ran | reported_lost(worker) & ids) == len(ids):
            break
        time.sleep(0.1)
    ran = {r["id"] for r in runs(rec, tag)} & ids
    lost = reported_lost(worker) & ids - ran
    return {"ran": len(ran), "reported": len(lost), "silent": len(ids) - len(ran) - len(lost)}


@pytest.fixture
def store_factory() -> Iterator[Any]:
    made: list[Store] = []

    def make(extra: list[str], replica: bool = False, proxied: bool = False) -> Store:
        made.append(Store(extra, replica, proxied))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def test_parked_runs_survive_a_lock_store_restart_or_are_reported(
    redis_url: str, rec: redis.Redis, redis_base: str, store_factory: Any
) -> None:
    app = limits_app(redis_url)
    stores = {
        "none": store_factory([]),
        "aof": store_factory(AOF),
        "aof+replica": store_factory(AOF, replica=True),
    }
    conf = {"aof+replica": {"redislock_wait_replicas": 1}}
    queues = {name: uniq(f"durable-{name}") for name in stores}
    workers = {
        name: start_worker(redis_base, store, name, queues[name], **conf.get(name, {}))
        for name, store in stores.items()
    }
    try:
        for worker in workers.values():
            worker.wait_ready()
        # No persistence: the worker warns as it starts; what the store lost is re-published.
        wait_until(lambda: "keeps no data on disk" in workers["none"].output(), 10, 0.05)
        # The scenarios side by side: park behind holders on every store, then
        # restart every store, then count what became of each store's runs.
        parked = {name: park_behind_holders(app, stores[name], queues[name]) for name in stores}
        time.sleep(1.5)  # past appendfsync everysec's fsync of every parked entry
        for store in stores.values():
            store.restart()
        until = time.monotonic() + 20
        figures = {
            name: outcome(rec, workers[name], tag, ids, until)
            for name, (tag, ids) in parked.items()
        }
        assert "the lock store lost its data" in workers["none"].output()
        assert "keeps no data on disk" not in workers["aof"].output()
    finally:
        stop_all(workers.values())
    for name, f in figures.items():
        report(f"parked then store restarted ({name}), of {N + QUIET}", **f)
    assert all(f["silent"] == 0 for f in figures.values()), figures
    assert figures["aof"]["ran"] == N + QUIET, figures
    assert figures["aof+replica"]["ran"] == N + QUIET, figures
    # Re-published (their results said PARKED), and the quiet ones reported.
    assert figures["none"] == {"ran": N, "reported": QUIET, "silent": 0}, figures


def test_worker_start_check_reads_the_stores_persistence_or_says_it_cannot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from celery import Celery

    from celery_redislock import LockedTask
    from celery_redislock.tasks import durability

    with RedisServer(extra=["--save", "3600 1"]) as server:
        admin = redis.Redis(port=server.port)
        admin.acl_setuser(
            "limited", enabled=True, passwords=["+pw"], commands=["+@all", "-config"], keys=["*"]
        )
        admin.close()
        for url, expected in (
            (server.url, "parked runs stored since its last snapshot are lost"),
            (f"redis://limited:pw@127.0.0.1:{server.port}/0", "refuses CONFIG GET"),
        ):
            app = Celery("durability", set_as_current=False)
            app.conf.update(redislock_url=url)

            @app.task(name="d.park", base=LockedTask, on_contention="park", shared=False)
            def park() -> None: ...

            @app.task(name="d.plain", base=LockedTask, shared=False)
            def plain() -> None: ...

            settings = config.settings_for(app)
            parking = durability.can_park(app, settings)
            assert "d.park" in parking and "d.plain" not in parking
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="celery_redislock"):
                thread = durability.check_durability(app, settings)
                assert thread is not None
                thread.join(10)
            assert expected in caplog.text, caplog.text
            assert "pw" not in caplog.text.replace("pw@", "")  # no password
            config.reset(app)


def test_the_index_an_older_version_kept_is_drained_into_the_tagged_one(
    r: redis.Redis,
) -> None:
    from celery_redislock.tasks import parking

    prefix = f"drain-{uniq()}"
    old = parking.legacy_index_key(prefix)
    r.zadd(old, {"lock:a": 1, "sem:b": 2})
    assert parking.drain_legacy_index(r, prefix) == 2
    assert r.exists(old) == 0
    assert {m.decode() for m in r.zrange(parking.index_key(prefix), 0, -1)} == {"lock:a", "sem:b"}
    assert parking.index_key(prefix) == f"{prefix}:{{#parked}}:index"
    assert parking.epoch_key(prefix) == f"{prefix}:{{#parked}}:epoch"
    assert parking.drain_legacy_index(r, prefix) == 0  # once
    r.delete(parking.index_key(prefix))


def test_a_park_the_replica_does_not_acknowledge_is_retried_not_parked(
    redis_url: str, rec: redis.Redis, redis_base: str, store_factory: Any
) -> None:
    """With wait_replicas, a park whose entry the replica did not acknowledge
    would be the message's only copy on one server: the run is re-sent through
    the broker instead, and runs once when the lock frees."""
    from celery_redislock.tasks import parking

    app = limits_app(redis_url)
    store = store_factory(AOF, replica=True, proxied=True)
    worker = worker_for(
        redis_base,
        store,
        "unacked",
        redislock_wait_replicas=1,
        redislock_wait_timeout_ms=200,
        redislock_lock_retry_backoff=0.2,
        redislock_lock_retry_backoff_max=0.5,
    )
    try:
        job, tag = uniq("job"), uniq("unacked")
        task = app.tasks["l.park"]
        name = task.lock_name_for((job, tag, 0.05), {})
        holder = Lock(store.client, name, ttl=20.0, renew=False, wait_replicas=1)
        holder.on_handoff = parking.publisher(app)  # its release re-publishes the parked run
        assert holder.acquire(blocking=False)
        store.proxy.stall()  # replication held back: WAIT times out
        result = task.apply_async((job, tag, 0.05))
        wait_until(
            lambda: "parked entry acknowledged by 0 of 1 replicas" in worker.output(),
            15,
            0.05,
            "the park to be taken back",
        )
        store.proxy.resume()
        pmsg = keys.lock_keys(config.settings_for(app).key_prefix, name).pmsg
        wait_until(lambda: store.client.hlen(pmsg) == 1, 15, 0.05, "the retried run to park")
        holder.release()
        wait_until(lambda: runs(rec, tag), 15, 0.05, "the run")
        time.sleep(0.5)
        assert [r["id"] for r in runs(rec, tag)] == [result.id]  # once
        retried = r"is held by task \w+; retry 1 in .* \(on_contention=park\)"
        assert re.search(retried, worker.output())  # re-sent, not parked
    finally:
        worker.stop()
