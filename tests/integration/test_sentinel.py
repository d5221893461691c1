"""The primitives through a Sentinel-managed client, across real failovers.

One local topology for the module (tests/sentinel.py: a master, a replica and
three sentinels on loopback), failed over back and forth by the tests with
``SENTINEL FAILOVER``.  Clients are built the way users build them:
``redis.sentinel.Sentinel(...).master_for(...)`` with a retry policy, so that
every connection (the pool's, and those the library makes from the pool's
settings for blocked waits and deadline-bounded calls) should ask the
sentinels where the master is whenever it connects.

What a failover does to a client, and what these tests rely on: the replica
is promoted (``REPLICAOF NO ONE``) at once, but the old master is left
running as a master, taking the writes of every client still connected to
it, until a sentinel turns it into a replica (Sentinel waits 4 hello periods
for that: about a second here, 8-10 s with production timers) and closes its
clients' connections.  Those writes are then discarded by its resync.  Only
then do redis-py's connections reconnect and ask the sentinels again.  That
interval is measured by ``LocalSentinel.failover()`` (``Failover.split_brain``)
and used below to tell a lease lost to it from a lease lost by the library.

Observations go through plain clients on each server (``INFO commandstats``,
``ROLE``, the primitives' keys); timings use time.monotonic().
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
import redis

from celery_redislock import BackendUnavailable, Lock, LockLost
from tests.helpers import blocked_clients, report, wait_until
from tests.sentinel import Failover, LocalSentinel, sentinel_client

pytestmark = [
    pytest.mark.slow,
    pytest.mark.fault,
    pytest.mark.usefixtures("no_leaked_leases"),
]

SERVICE = "mymaster"


# -- fixtures and helpers ------------------------------------------------------


@pytest.fixture
def client(topology: LocalSentinel) -> Iterator[redis.Redis]:
    sentinel, client = sentinel_client(topology)
    yield client
    client.close()
    client.connection_pool.disconnect()
    for each in sentinel.sentinels:
        each.close()


def unique(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def direct(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=2)


def calls(port: int, command: str) -> int:
    """How many times the server on ``port`` ran (or refused) ``command``."""
    with direct(port) as r:
        stats = r.info("commandstats").get(f"cmdstat_{command.lower()}", {})
    return int(stats.get("calls", 0)) + int(stats.get("rejected_calls", 0))


def blocked_on(port: int) -> int:
    """How many connections are blocked (BLPOP) on the server on ``port``."""
    with direct(port) as r:
        return blocked_clients(r)


def queued(port: int, lock: Lock) -> int:
    with direct(port) as r:
        return int(r.zcard(lock.keys.queue))


def describe(f: Failover) -> str:
    return (
        f"failover {f.old} -> {f.new}: promoted +{f.promoted - f.started:.2f} s, "
        f"old master demoted +{f.demoted - f.started:.2f} s "
        f"(both masters for {f.split_brain:.2f} s, the old one running "
        f"{f.old_master_scripts} scripts meanwhile), settled +{f.seconds:.2f} s"
    )


@dataclass
class Outcome:
    """What one worker thread did: timestamped results and errors."""

    name: str
    errors: list[tuple[float, str, BaseException]] = field(default_factory=list)
    fences: list[int] = field(default_factory=list)
    #: Set by a waiter thread: (acquired, when it returned, fence).
    waited: Optional[tuple[bool, float, Optional[int]]] = None
    #: Holds taken while the failover ran (busy threads): (acquired at, released at).
    holds: list[tuple[float, float]] = field(default_factory=list)
    #: (when, seconds) of each acquire+release cycle after the failover.
    cycles: list[tuple[float, float]] = field(default_factory=list)

    def fail(self, stage: str, exc: BaseException) -> None:
        self.errors.append((time.monotonic(), stage, exc))


# -- a. threads follow a failover ---------------------------------------------


def test_threads_that_used_locks_follow_a_failover(
    topology: LocalSentinel, client: redis.Redis, lost_events: list[tuple[Any, str]]
) -> None:
    """Four threads whose connections (pooled, and idle wait connections) were
    made on the old master: two wait on held locks across the failover, two
    cycle a lock of their own through it; then all cycle a shared lock 20
    times each, on the new master only, without errors."""
    prefix = unique("follow")
    old = topology.master_port()
    outcomes = [Outcome(f"thread-{i}") for i in range(4)]
    warm = Lock(client, f"{prefix}-warm", ttl=2.0)
    held = [Lock(client, f"{prefix}-held-{i}", ttl=2.0) for i in range(2)]
    warmed = threading.Barrier(5)
    failing_over = threading.Event()  # set while the failover runs (busy threads work)
    post = threading.Event()  # the failover is over: 20 cycles each
    cancel = threading.Event()  # the test failed before that: skip them
    shared = f"{prefix}-after"

    def run(i: int) -> None:
        out = outcomes[i]
        try:
            # Queue behind the main thread (a BLPOP on a wait connection,
            # then kept idle by the library), then hold and release.
            lock = Lock(client, warm.name, ttl=2.0)
            if lock.acquire(timeout=10):
                time.sleep(0.01)
                lock.release()
            else:
                out.fail("warm-up", TimeoutError("acquire timed out"))
        except BaseException as exc:
            out.fail("warm-up", exc)
        with contextlib.suppress(threading.BrokenBarrierError):
            warmed.wait(15)
        if i < 2:  # a waiter on a held lock
            lock = Lock(client, held[i].name, ttl=2.0)
            try:
                ok = lock.acquire(timeout=20)
                out.waited = (ok, time.monotonic(), lock.fence)
                if ok:
                    time.sleep(0.05)
                    lock.release()
            except BaseException as exc:
                out.fail("wait", exc)
        else:  # busy through the failover, on a name of its own
            failing_over.wait(10)
            while failing_over.is_set():
                lock = Lock(client, f"{prefix}-busy-{i}", ttl=2.0)
                try:
                    if not lock.acquire(timeout=5):
                        out.fail("busy", TimeoutError("acquire timed out"))
                        continue
                    began = time.monotonic()
                    time.sleep(0.02)
                    lock.release()
                    out.holds.append((began, time.monotonic()))
                except BaseException as exc:
                    out.fail("busy", exc)
        post.wait(60)
        for _ in range(0 if cancel.is_set() else 20):
            if len([e for e in out.errors if e[1] == "after"]) >= 3:
                break  # broken: the test fails on these, no need to go on
            lock = Lock(client, shared, ttl=2.0)
            began = time.monotonic()
            try:
                if not lock.acquire(timeout=5):
                    out.fail("after", TimeoutError("acquire timed out"))
                    continue
                out.fences.append(int(lock.fence or 0))
                lock.release()
                out.cycles.append((began, time.monotonic() - began))
            except BaseException as exc:
                out.fail("after", exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    try:
        calls_before = calls(old, "evalsha")
        assert warm.acquire(blocking=False)
        for t in threads:
            t.start()
        try:
            wait_until(lambda: queued(old, warm) == 4 and blocked_on(old) >= 4, 5)
        except AssertionError:
            pytest.fail(
                f"4 threads are not queued behind the warm-up lock and blocked on the "
                f"master {old} (queued {queued(old, warm)}, blocked {blocked_on(old)}): "
                f"{[o.errors for o in outcomes]}"
            )
        for lock in held:
            assert lock.acquire(blocking=False)
        warm.release()
        warmed.wait(15)
        assert not any(o.errors for o in outcomes), [o.errors for o in outcomes]
        # Every script call so far reached the master: 1 + 4 acquires, 5
        # releases, 2 more acquires, at the least.
        assert calls(old, "evalsha") - calls_before >= 12
        assert client.connection_pool.master_address == ("127.0.0.1", old)
        holder_fences = [lock.fence for lock in held]
        wait_until(
            lambda: all(queued(old, lock) == 1 for lock in held) and blocked_on(old) >= 2,
            5,
            what=f"a waiter queued on each held lock, blocked on the master {old}",
        )

        failing_over.set()
        f = topology.failover()
        failing_over.clear()
        print(describe(f))
        new = f.new

        # -- the held locks, and their waiters ------------------------------
        with direct(new) as r:
            on_new = [r.get(lock.key) for lock in held]
        lost = [lock.lost or not lock.owned() for lock in held]
        released_at = []
        for lock, was_lost, value in zip(held, lost, on_new):
            if not was_lost:
                assert value is not None and value.decode() == lock.token
                lock.release()
            else:
                # Said explicitly: the renewals of the split-brain interval
                # went to the old master and were discarded; the copy on the
                # new master ran out.  That is Sentinel's doing only if the
                # interval (plus the time since the last renewal before it)
                # outlasted the lease; and the library must have noticed (a
                # renewal that reached the new master found the lease gone)
                # and must say so on release.
                print(
                    f"{lock.name}: lease of {lock.ttl:g} s lost over the failover: the old "
                    f"master took its renewals for {f.split_brain:.2f} s after the promotion"
                )
                assert f.split_brain + lock.renew_interval + 0.25 >= lock.ttl, (
                    f"{lock.name} was lost although the old master stopped taking writes "
                    f"{f.split_brain:.2f} s after the promotion, well within its lease: "
                    f"{describe(f)}"
                )
                # (``lost`` is set before the listeners are told.)
                reasons = wait_until(
                    lambda lock=lock: [why for lease, why in lost_events if lease is lock],
                    3,
                    what=f"{lock.name} reported lost",
                )
                assert lock.lost
                assert "expired or was taken over" in reasons[0], reasons
                with pytest.raises(LockLost):
                    lock.release()
            released_at.append(time.monotonic())

        for i, (lock, was_lost) in enumerate(zip(held, lost)):
            wait_until(lambda i=i: outcomes[i].waited or outcomes[i].errors, 5, what="waiter done")
            out = outcomes[i]
            assert out.errors == [], f"waiter on {lock.name}: {out.errors}"
            assert out.waited is not None
            ok, returned, fence = out.waited
            assert ok, f"waiter on {lock.name} gave up"
            assert fence is not None and fence > (holder_fences[i] or 0)
            if not was_lost:
                # Handed over by the release, on the new master: not a lease later.
                assert released_at[i] - 0.01 <= returned <= released_at[i] + 0.5, (
                    returned - released_at[i]
                )
            else:
                # Granted once the lease ran out on the new master.
                assert returned <= f.settled + lock.ttl + 1.0, returned - f.settled

        # -- through the failover: busy threads -------------------------------
        late = f.demoted + 2.0
        for out in outcomes[2:]:
            assert out.holds, f"{out.name} held nothing during the failover"
            for when, stage, exc in out.errors:
                assert stage == "busy", (stage, exc)
                if isinstance(exc, LockLost):
                    continue  # checked below
                assert isinstance(exc, BackendUnavailable), f"{out.name}: {exc!r}"
                assert when <= late, (
                    f"{out.name}: BackendUnavailable {when - f.demoted:.2f} s after the "
                    f"old master was demoted: {exc!r}"
                )
            lost_holds = [e for e in out.errors if isinstance(e[2], LockLost)]
            # A hold lost over the failover was taken on the old master just
            # before it was demoted, and released on the new one.
            assert len(lost_holds) <= 1, lost_holds

        # -- after the failover: 20 cycles per thread, on the new master ------
        before_new, before_old = calls(new, "evalsha"), calls(f.old, "evalsha")
        started = time.monotonic()
        post.set()
        for t in threads:
            t.join(max(0.0, started + 20 - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "a thread hung"
        elapsed = time.monotonic() - started
        after_new, after_old = calls(new, "evalsha"), calls(f.old, "evalsha")
        for out in outcomes:
            after = [(stage, exc) for _, stage, exc in out.errors if stage == "after"]
            assert after == [], f"{out.name} after the failover: {after}"
            assert len(out.cycles) == 20, out.name
            first = out.cycles[0][1]
            assert first < 2.0, f"{out.name}: first cycle after the failover took {first:.2f} s"
        fences = sorted(fence for out in outcomes for fence in out.fences)
        assert len(set(fences)) == 80
        # Every acquire and release went to the new master, none to the old one.
        assert after_new - before_new >= 2 * 80, (before_new, after_new)
        assert after_old == before_old, (before_old, after_old)
        assert client.connection_pool.master_address == ("127.0.0.1", new)
        print(f"80 cycles on the new master in {elapsed:.2f} s")
    finally:
        # Let every thread finish (a failed test must not leave holders or
        # waiters running into the next one).
        warmed.abort()
        failing_over.clear()
        if not post.is_set():
            cancel.set()
        post.set()
        until = time.monotonic() + 25
        for t in threads:
            if t.ident is not None:
                t.join(max(0.0, until - time.monotonic()))
        for lock in [warm, *held]:
            if lock.token is not None:
                with contextlib.suppress(Exception):
                    lock.release()


# -- b. fences ------------------------------------------------------------------


def test_fences_keep_rising_across_failovers(topology: LocalSentinel, client: redis.Redis) -> None:
    """30 grants of one name per master, failing over there and back between:
    every fence is above the one before, and each round ran on its master."""
    name = unique("fences")
    fences: list[int] = []
    #: Per round of cycles: EVALSHA calls each server ran during it, by port.
    served: list[dict[int, int]] = []

    def cycles(n: int) -> None:
        before = {port: calls(port, "evalsha") for port in topology.server_ports}
        for _ in range(n):
            lock = Lock(client, name, ttl=2.0)
            assert lock.acquire(timeout=5)
            if not lock.owned():
                with contextlib.suppress(LockLost):
                    lock.release()
                pytest.fail("acquire() returned True, but the master the sentinels name lacks it")
            assert lock.fence is not None
            fences.append(lock.fence)
            lock.release()
        served.append({p: calls(p, "evalsha") - before[p] for p in topology.server_ports})

    first = topology.master_port()
    (other,) = [p for p in topology.server_ports if p != first]
    cycles(30)
    there = topology.failover()
    print(describe(there))
    cycles(30)
    back = topology.failover()
    print(describe(back))
    cycles(30)
    assert (there.old, there.new, back.old, back.new) == (first, other, other, first)
    # Each round ran on that round's master (NOSCRIPT resends may add a call).
    for round_, master in zip(served, [first, other, first]):
        (replica,) = [p for p in round_ if p != master]
        assert round_[master] >= 60 and round_[replica] == 0, served
    for i in range(1, len(fences)):
        assert fences[i] > fences[i - 1], (i, fences[i - 1], fences[i])
    # The fence key on the current master holds the last fence handed out.
    with direct(first) as r:
        assert int(r.get(Lock(client, name).keys.fence) or 0) == fences[-1]


# -- c. a waiter blocked during a failover -------------------------------------


def test_a_waiter_blocked_during_a_failover_does_not_hang(
    topology: LocalSentinel, client: redis.Redis
) -> None:
    """acquire(timeout=8), blocked on the old master when the failover starts,
    returns False on time (the 30 s holder keeps the lock), and leaves no entry
    in line that a release would then grant to nobody."""
    name = unique("waiter")
    old = topology.master_port()
    # A lease far longer than the failover: the holder keeps it throughout.
    holder = Lock(client, name, ttl=30.0)
    assert holder.acquire(blocking=False)
    result: dict[str, Any] = {}

    def wait() -> None:
        waiter = Lock(client, name, ttl=2.0)
        started = time.monotonic()
        try:
            result["acquired"] = waiter.acquire(timeout=8)
        except BaseException as exc:
            result["error"] = exc
        result["seconds"] = time.monotonic() - started
        result["waiter"] = waiter

    thread = threading.Thread(target=wait, daemon=True)
    try:
        thread.start()
        try:
            wait_until(lambda: queued(old, holder) == 1 and blocked_on(old) >= 1, 5)
        except AssertionError:
            pytest.fail(
                f"the waiter is not queued and blocked on the master {old} "
                f"(queued {queued(old, holder)}, blocked {blocked_on(old)}): {result}"
            )
        f = topology.failover()
        print(describe(f))
        thread.join(12)
        assert not thread.is_alive(), "acquire(timeout=8) still blocked 12 s later"
        assert "error" not in result, repr(result.get("error"))
        assert result["seconds"] <= 10.0, result
        if result["acquired"]:
            # Only legitimate if the holder's 30 s lease had been lost.
            result["waiter"].release()
            assert holder.lost, "the waiter was granted a lock its holder still held"
            pytest.fail(f"a 30 s lease was lost over a {f.seconds:.1f} s failover")
        assert result["seconds"] >= 7.9, result
        assert not holder.lost and holder.owned()
        # Nothing of the waiter is left in line on the new master ...
        assert queued(f.new, holder) == 0
        # ... so a release frees the lock rather than granting it to nobody.
        holder.release()
        fresh = Lock(client, name, ttl=2.0)
        assert fresh.acquire(blocking=False), "the lock went to a waiter that had given up"
        fresh.release()
    finally:
        thread.join(12)
        waiter = result.get("waiter")
        for lock in [holder, waiter]:
            if lock is not None and lock.token is not None:
                with contextlib.suppress(Exception):
                    lock.release()


def failing_over(topology: LocalSentinel, old: int) -> tuple[threading.Thread, list[Failover], int]:
    """Start a failover away from ``old`` in a thread; return once the other
    server answers as a master (the split brain: ``old`` still takes writes).
    The thread, the list its Failover lands in, and the new master's port."""
    done: list[Failover] = []
    runner = threading.Thread(target=lambda: done.append(topology.failover()))
    runner.start()
    new = next(p for p in topology.servers if p != old)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError):
            if direct(new).execute_command("ROLE")[0] == b"master":
                break
        time.sleep(0.005)
    return runner, done, new


@pytest.mark.parametrize("replicas", [0, 1], ids=["without", "with wait_replicas=1"])
def test_double_grants_in_a_failovers_split_brain(topology: LocalSentinel, replicas: int) -> None:
    """During a failover the old master still takes writes until it is demoted.
    A client still connected there takes locks; a client of the new master
    takes the same names.  Without wait_replicas both hold them; with it, the
    old master (whose replica has just left it) cannot get its grants
    acknowledged, so they are undone."""
    old = topology.master_port()
    names = [unique("split") for _ in range(5)]
    stale = direct(old)  # connected before the failover, as a worker's pool is
    stale.ping()
    runner, done, new = failing_over(topology, old)
    first = [
        Lock(stale, n, ttl=5.0, renew=False, wait_replicas=replicas, wait_timeout_ms=100)
        for n in names
    ]
    held = []
    for lock in first:
        with contextlib.suppress(redis.RedisError, BackendUnavailable):
            held.append(lock.acquire(blocking=False))
    fresh = direct(new)
    second = [Lock(fresh, n, ttl=5.0, renew=False) for n in names]
    both = sum(1 for a, b, ok in zip(first, second, held) if ok and b.acquire(blocking=False))
    runner.join(20)
    for b in second:
        if b.token is not None:
            b.release()
    for a in first:
        a._token = None  # (their keys went with the old master's resync)
    stale.close()
    fresh.close()
    report("sentinel split-brain double grants", wait_replicas=replicas, names=5, double=both)
    assert done, "the failover did not finish"
    if replicas:
        assert both == 0 and not any(held)
    else:
        assert both == len(names), (held, describe(done[0]))


def test_min_replicas_to_write_ends_the_split_brains_double_grants(
    topology: LocalSentinel,
) -> None:
    """The server-side remedy, without ``wait_replicas``: with
    ``min-replicas-to-write 1`` on both data servers, the old master refuses
    writes once its replica has left it (promoted), so a client still
    connected there is granted nothing; the new master takes writes again once
    the old one has joined it as its replica.  The same scenario without the
    setting grants every name twice (test_double_grants_in_a_failovers_split_brain)."""
    ports = topology.server_ports
    for port in ports:
        direct(port).config_set("min-replicas-to-write", 1)
        direct(port).config_set("min-replicas-max-lag", 10)
    try:
        old = topology.master_port()
        names = [unique("minrep") for _ in range(5)]
        stale = direct(old)
        stale.ping()
        runner, done, new = failing_over(topology, old)
        first = [Lock(stale, n, ttl=5.0, renew=False) for n in names]
        held, refused = [], 0
        for lock in first:
            try:
                held.append(lock.acquire(blocking=False))
            except redis.ResponseError as exc:
                assert "NOREPLICAS" in str(exc), exc
                held.append(False)
                refused += 1
            except (redis.RedisError, BackendUnavailable):
                held.append(False)
        fresh = direct(new)
        second = [Lock(fresh, n, ttl=5.0, renew=False) for n in names]
        both = granted = 0
        for b, ok in zip(second, held):
            # The new master refuses writes too until its replica (the old
            # master) has joined it: ask until it answers.
            until = time.monotonic() + 20
            while True:
                try:
                    got = b.acquire(blocking=False)
                    break
                except redis.ResponseError:
                    if time.monotonic() > until:
                        raise
                    time.sleep(0.05)
            granted += got
            both += bool(ok and got)
        runner.join(20)
        for b in second:
            if b.token is not None:
                b.release()
        for a in first:
            a._token = None
        stale.close()
        fresh.close()
        report(
            "sentinel split-brain double grants, min-replicas-to-write 1",
            names=5,
            refused=refused,
            double=both,
        )
        assert done, "the failover did not finish"
        assert both == 0 and not any(held), (held, describe(done[0]))
        assert granted == len(names)  # the new master grants them, once its replica is back
    finally:
        for port in ports:
            with contextlib.suppress(redis.RedisError):
                direct(port).config_set("min-replicas-to-write", 0)
