"""``wait_replicas``: grants, renewals and releases that wait for replicas (``WAIT``).

Each test starts a master and a replica that replicates through a loopback
TCP proxy (tests.helpers.TcpProxy), so a test can hold replication back
(``blackhole()``: every byte dropped, sockets left open) while the master
still answers clients.  A failover is what Sentinel does once the master is
lost: the replica is promoted (``REPLICAOF NO ONE``) and clients go to it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_redislock import ConfigurationError, Lock, Semaphore
from tests.helpers import TcpProxy, report, wait_until
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.usefixtures("no_leaked_leases"), pytest.mark.fault]


class Pair:
    """A master and a replica linked through a proxy."""

    def __init__(self) -> None:
        self.master = RedisServer(extra=["--repl-diskless-sync-delay", "0"]).start()
        self.proxy = TcpProxy("127.0.0.1", self.master.port)
        self.replica = RedisServer(extra=["--replicaof", "127.0.0.1", str(self.proxy.port)])
        self.replica.start()
        self.m = redis.Redis(port=self.master.port)
        self.r = redis.Redis(port=self.replica.port)
        wait_until(
            lambda: self.r.info("replication").get("master_link_status") == "up",
            10,
            0.02,
            "the replica to sync",
        )
        # A replica fresh from its first sync acknowledges on its once-a-second
        # timer at first; one waited-for write, and it answers WAIT at once.
        self.m.set("probe", 1)
        assert self.m.wait(1, 5000) == 1
        self.m.delete("probe")

    def promote(self) -> None:
        """What Sentinel does when the master is gone: the replica takes over."""
        self.r.execute_command("REPLICAOF", "NO", "ONE")

    def stop(self) -> None:
        self.m.close()
        self.r.close()
        self.proxy.close()
        self.replica.kill()
        self.master.kill()


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.stop()


def test_a_grant_returns_once_the_replica_has_it_and_so_does_a_release(pair: Pair) -> None:
    lock = Lock(pair.m, "replicated", ttl=5.0, wait_replicas=1)
    assert lock.acquire(blocking=False)
    assert pair.r.get(lock.key) == lock.token.encode()  # type: ignore[union-attr]
    lock.extend()
    lock.release()
    assert pair.r.exists(lock.key) == 0


def test_a_grant_the_replica_does_not_acknowledge_is_undone(pair: Pair) -> None:
    pair.proxy.blackhole()
    lock = Lock(pair.m, "unreplicated", ttl=5.0, wait_replicas=1, wait_timeout_ms=200)
    started = time.monotonic()
    assert lock.acquire(blocking=False) is False
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 1.0
    assert lock.token is None and lock.fence is None
    assert pair.m.exists(lock.key) == 0  # undone on the master
    sem = Semaphore(pair.m, "unreplicated", 2, ttl=5.0, wait_replicas=1, wait_timeout_ms=200)
    assert sem.acquire(timeout=0.5) is False
    assert pair.m.zcard(sem.keys.holders) == 0


def test_a_park_the_replica_does_not_acknowledge_is_taken_back(pair: Pair) -> None:
    """A parked entry is its message's only copy: one the replica never heard
    of would be lost by a failover, so it does not count as parked."""

    holder = Lock(pair.m, "parked", ttl=5.0, wait_replicas=1, wait_timeout_ms=200)
    assert holder.acquire(blocking=False)
    replicated = Lock(pair.m, "parked", ttl=5.0, renew=False, wait_replicas=1)
    assert replicated.park("tok-1", b"payload-1") == "parked"
    assert pair.r.hget(replicated.keys.pmsg, "tok-1") == b"payload-1"
    pair.proxy.blackhole()
    unreplicated = Lock(
        pair.m, "parked", ttl=5.0, renew=False, wait_replicas=1, wait_timeout_ms=200
    )
    assert unreplicated.park("tok-2", b"payload-2") == "unreplicated"
    assert pair.m.hexists(unreplicated.keys.pmsg, "tok-2") == 0  # taken back on the master
    assert pair.m.zscore(unreplicated.keys.queue, "tok-2") is None
    assert pair.m.hget(unreplicated.keys.pmsg, "tok-1") == b"payload-1"  # the other stays
    holder.release()


def test_a_renewal_the_replica_does_not_acknowledge_does_not_count(
    pair: Pair, lost_events: list[Any]
) -> None:
    lock = Lock(pair.m, "renewed", ttl=0.9, wait_replicas=1, wait_timeout_ms=100)
    assert lock.acquire()
    pair.proxy.blackhole()
    # The master keeps extending the lease; the replica, which a failover
    # would promote, never hears of it: the holder must learn its lease is
    # not safe once the last acknowledged lease has run out.
    # (The keeper tells the listeners just after it marks the lease lost.)
    wait_until(lambda: lock.lost and lost_events, 3, 0.02, "the holder to be told")
    assert [lease for lease, _ in lost_events] == [lock]
    lock.token and lock.release()


@pytest.mark.parametrize("replicas", [0, 1], ids=["without", "with wait_replicas=1"])
def test_double_grants_across_a_failover(replicas: int) -> None:
    """The master grants a lock, replication is held back, the master is lost
    and its replica promoted, and a second client takes the lock there."""
    trials, double = 5, 0
    for _ in range(trials):
        pair = Pair()
        try:
            pair.proxy.blackhole()
            first = Lock(
                pair.m, "failover", ttl=5.0, renew=False, wait_replicas=replicas,
                wait_timeout_ms=200,
            )  # fmt: skip
            held = first.acquire(blocking=False)
            pair.promote()
            second = Lock(pair.r, "failover", ttl=5.0, renew=False)
            assert second.acquire(blocking=False)
            if held and first.owned():  # both believe they hold it
                double += 1
            second.release()
        finally:
            pair.stop()
    report("double grants across a failover", wait_replicas=replicas, trials=trials, double=double)
    assert double == (trials if replicas == 0 else 0)


def test_bad_wait_options_name_the_lock_and_the_value(r: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match=r"wait_replicas of lock 'x'.*-1"):
        Lock(r, "x", wait_replicas=-1)
    with pytest.raises(ConfigurationError, match=r"wait_timeout_ms of lock 'x'.*0"):
        Lock(r, "x", wait_replicas=1, wait_timeout_ms=0)


def test_tasks_take_wait_replicas_from_the_app_settings(pair: Pair) -> None:
    from celery import Celery

    from celery_redislock import LockContended, LockedTask

    app = Celery("replicas", set_as_current=False)
    app.conf.update(
        redislock_url=f"redis://127.0.0.1:{pair.master.port}/0",
        redislock_wait_replicas=1,
        redislock_wait_timeout_ms=200,
    )

    @app.task(name="replicas.job", base=LockedTask, on_contention="fail", shared=False)
    def job() -> str:
        return "ran"

    app.finalize()
    assert job.apply().get() == "ran"  # eager: locked, with the replica's acknowledgement
    pair.proxy.blackhole()
    with pytest.raises(LockContended):
        job.apply().get()  # the grant was not replicated in time: undone, contended
    app.close()
