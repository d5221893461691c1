"""Unique keys in Redis, without Celery: the scripts a publish and a run call.

Against a real redis-server: who holds a key, what a duplicate is told, how a
run's lock scripts start and end its claim, what renewal keeps, what expiry
frees, and how many round trips each takes (counted client-side).
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_redislock.primitives import Lock, Semaphore, keys, reap, unique
from celery_redislock.primitives import _keeper as renewal
from tests.helpers import counting_client, wait_until

pytestmark = pytest.mark.usefixtures("no_leaked_leases")


def ukey(name: str) -> str:
    return keys.unique_key("redislock", name)


def claim(name: str, job: str, mode: str = "f", hold_ms: int = 5000, keep_ms: int = 0):
    return unique.Claim(ukey(name), job, mode, hold_ms, keep_ms)


def test_a_publish_takes_the_key_and_a_duplicate_names_its_holder(r: redis.Redis) -> None:
    k = ukey("k1")
    assert unique.publish(r, k, "A", "f", 5000) == unique.Published(True)
    dup = unique.publish(r, k, "B", "f", 5000)
    assert (dup.accepted, dup.other) == (False, "A")
    assert 4000 < dup.ttl_ms <= 5000
    assert unique.state(r, k).holder == "A"
    # The same job again (a retry) is never its own duplicate.
    assert unique.publish(r, k, "A", "f", 5000, again=True).accepted
    assert unique.publish(r, k, "A", "f", 5000).accepted
    # The key expires with its hold: nothing is left behind.
    assert 4000 < r.pttl(k) <= 5000


def test_a_waiting_job_frees_its_key_when_its_hold_runs_out(r: redis.Redis) -> None:
    k = ukey("lapse")
    assert unique.publish(r, k, "A", "s", 150).accepted
    assert not unique.publish(r, k, "B", "s", 150).accepted
    time.sleep(0.2)
    assert unique.publish(r, k, "B", "s", 150).accepted
    assert unique.state(r, k).waiting == "B"


def test_exactly_one_of_many_concurrent_publishes_is_accepted(redis_url: str) -> None:
    k = ukey("race")
    clients = [redis.Redis.from_url(redis_url) for _ in range(50)]
    for c in clients:
        c.ping()
    barrier = threading.Barrier(50)
    outcomes: list[unique.Published] = []

    def one(i: int) -> None:
        barrier.wait()
        outcomes.append(unique.publish(clients[i], k, f"job{i}", "f", 5000))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.accepted]
    assert len(winners) == 1
    holder = unique.state(clients[0], k).holder
    assert {o.other for o in outcomes if not o.accepted} == {holder}
    for c in clients:
        c.close()


def test_until_finished_holds_the_key_while_the_run_holds_its_lock(r: redis.Redis) -> None:
    c = claim("fin", "A", "f")
    assert unique.publish(r, c.key, "A", "f", 5000).accepted
    lock = Lock(r, "fin", ttl=2, renew=False)
    lock.claim = c
    assert lock.acquire(blocking=False)
    state = unique.state(r, c.key)
    assert (state.waiting, state.running) == (None, "A")
    assert 1000 < state.running_ms <= 2000  # its lease
    assert unique.publish(r, c.key, "B", "f", 5000).other == "A"
    lock.release()
    assert not r.exists(c.key)
    assert unique.publish(r, c.key, "B", "f", 5000).accepted


def test_until_started_frees_the_key_as_the_run_takes_its_lock(r: redis.Redis) -> None:
    c = claim("sta", "A", "s")
    assert unique.publish(r, c.key, "A", "s", 5000).accepted
    sem = Semaphore(r, "sta", 2, ttl=2, renew=False)
    sem.claim = c
    assert sem.acquire(blocking=False)
    assert not r.exists(c.key)
    assert unique.publish(r, c.key, "B", "s", 5000).accepted
    sem.release()
    assert unique.state(r, c.key).waiting == "B"  # the end of A's run leaves B alone


def test_a_contended_run_keeps_its_key_and_a_parked_one_holds_it_longer(r: redis.Redis) -> None:
    holder = Lock(r, "cont", ttl=5, renew=False)
    assert holder.acquire(blocking=False)
    c = claim("cont", "A", "s", hold_ms=60_000)
    assert unique.publish(r, c.key, "A", "s", 300).accepted
    run = Lock(r, "cont", ttl=5, renew=False)
    run.claim = c
    assert not run.acquire(blocking=False)
    assert unique.state(r, c.key).waiting == "A"
    assert r.pttl(c.key) <= 300
    # Parked: it waits in Redis now, and holds its key for a whole hold again.
    parked = Lock(r, "cont", ttl=5, renew=False)
    parked.claim = c
    assert parked._attempt("A-park-token", 0, b"payload") == 0
    assert r.pttl(c.key) > 50_000
    holder.release()


def test_a_retried_run_keeps_its_key_for_the_same_job(r: redis.Redis) -> None:
    c = claim("retry", "A", "f")
    assert unique.publish(r, c.key, "A", "f", 5000).accepted
    lock = Lock(r, "retry", ttl=2, renew=False)
    lock.claim = c
    assert lock.acquire(blocking=False)
    lock.claim = unique.Claim(c.key, "A", "f", 5000, waits_again=True)
    lock.release()
    state = unique.state(r, c.key)
    assert (state.waiting, state.running) == ("A", None)
    assert unique.publish(r, c.key, "B", "f", 5000).other == "A"
    assert unique.publish(r, c.key, "A", "f", 5000, again=True).accepted


def test_replace_supersedes_the_waiting_job_and_its_run_is_refused(r: redis.Redis) -> None:
    k = ukey("rep")
    assert unique.publish(r, k, "A", "s", 5000).accepted
    out = unique.publish(r, k, "B", "s", 5000, replace=True)
    assert (out.accepted, out.other) == (True, "A")
    old = Lock(r, "rep", ttl=2, renew=False)
    old.claim = claim("rep", "A", "s")
    assert not old.acquire(blocking=False)
    assert old.superseded_by == "B"
    assert not r.exists(old.keys.lock)  # refused before anything was taken
    assert unique.superseded(r, claim("rep", "A", "s")) == "B"
    new = Lock(r, "rep", ttl=2, renew=False)
    new.claim = claim("rep", "B", "s")
    assert new.acquire(blocking=False)
    new.release()


def test_a_throttle_window_accepts_one_job(r: redis.Redis) -> None:
    k = ukey("thr")
    assert unique.publish(r, k, "A", "-", 5000, throttle_ms=200).accepted
    assert unique.publish(r, k, "B", "-", 5000, throttle_ms=200).other == "A"
    time.sleep(0.25)
    assert unique.publish(r, k, "B", "-", 5000, throttle_ms=200).accepted


def test_renewal_keeps_a_running_job_s_key_and_stopping_lets_it_lapse(r: redis.Redis) -> None:
    c = claim("renew", "A", "f")
    assert unique.publish(r, c.key, "A", "f", 5000).accepted
    lock = Lock(r, "renew", ttl=0.6)
    lock.claim = c
    assert lock.acquire(blocking=False)
    lease = unique.RunLease(r, c, 0.6, 0.2)
    lease.start()
    time.sleep(1.2)  # twice the lease
    assert unique.state(r, c.key).running == "A"
    lease.stop()
    lock.release()
    assert not r.exists(c.key)
    # A run nobody renews (its process died) lets the key go with its lease.
    c2 = claim("renew2", "B", "f")
    assert unique.publish(r, c2.key, "B", "f", 60_000).accepted
    dead = Lock(r, "renew2", ttl=0.3, renew=False)
    dead.claim = c2
    assert dead.acquire(blocking=False)
    wait_until(lambda: not r.exists(c2.key), timeout=2, what="the dead run's key to lapse")
    del dead


def test_keep_ms_holds_a_running_job_s_key_for_a_redelivery(r: redis.Redis) -> None:
    c = claim("late", "A", "f", keep_ms=1500)
    assert unique.publish(r, c.key, "A", "f", 60_000).accepted
    dead = Lock(r, "late", ttl=0.2, renew=False)
    dead.claim = c
    assert dead.acquire(blocking=False)
    time.sleep(0.5)  # the lease is gone, the key is not
    assert unique.publish(r, c.key, "B", "f", 5000).other == "A"
    # The redelivered run of the same job holds it again.
    again = Lock(r, "late", ttl=2, renew=False)
    again.claim = c
    assert again.acquire(blocking=False)
    again.release()
    assert not r.exists(c.key)


def test_reaping_a_dead_run_ends_its_claim(r: redis.Redis) -> None:
    c = claim("reap", "A", "f")
    assert unique.publish(r, c.key, "A", "f", 5000).accepted
    lock = Lock(r, "reap", ttl=5, renew=False, owner="A|host|42|")
    lock.claim = c
    assert lock.acquire(blocking=False)
    assert reap(r, "reap", "A|host|42|", claim=c)
    assert not r.exists(c.key) and not r.exists(lock.keys.lock)


def test_drop_frees_the_key_of_the_named_job_only(r: redis.Redis) -> None:
    k = ukey("drop")
    assert unique.publish(r, k, "A", "s", 5000).accepted
    assert unique.drop(r, k, "B") is None
    assert unique.drop(r, k, "A") == "A"
    assert unique.publish(r, k, "B", "s", 5000, throttle_ms=5000).accepted
    assert unique.drop(r, k) == "B"
    assert not r.exists(k)


def test_publish_and_a_claimed_run_each_take_one_round_trip(redis_url: str) -> None:
    client, trips = counting_client(redis_url)
    client.ping()
    k = ukey("rt")
    for job in ("A", "B"):  # a new key, then a duplicate
        trips.reset()
        unique.publish(client, k, job, "f", 5000)
        assert trips.names() == [["EVALSHA"]]
    lock = Lock(client, "rt", ttl=2, renew=False)
    lock.claim = claim("rt", "A", "f")
    trips.reset()
    assert lock.acquire(blocking=False)
    lock.release()
    assert trips.names() == [["EVALSHA"], ["EVALSHA"]]
    client.close()


def test_the_keeper_renews_a_run_lease_in_the_same_round_trip_as_its_lock(
    redis_url: str,
) -> None:
    client, trips = counting_client(redis_url)
    client.ping()
    c = claim("batch", "A", "f")
    unique.publish(client, c.key, "A", "f", 5000)
    lock = Lock(client, "batch", ttl=0.9, renew_interval=0.3)
    lock.claim = c
    assert lock.acquire(blocking=False)
    lease = unique.RunLease(client, c, 0.9, 0.3)
    lease.granted_at = lock.granted_at
    lease.start()
    trips.reset()
    before = renewal.keeper().round_trips
    time.sleep(1.0)
    renewals = [s for s in trips.sends if s and s[0][0] == b"EVALSHA"]
    assert renewals, "nothing renewed"
    assert renewal.keeper().round_trips - before == len(renewals)
    assert all(len(s) == 2 for s in renewals), [len(s) for s in renewals]  # lock + key, one trip
    lease.stop()
    lock.release()
    client.close()
