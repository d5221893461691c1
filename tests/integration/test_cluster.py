"""The primitives on a real 3-master Redis Cluster, through redis.cluster.RedisCluster.

The cluster (tests/cluster.py) is three local redis-server processes joined by
``redis-cli --cluster create``, started once for the module.  Every test talks
to it through ``RedisCluster(host="127.0.0.1", port=<first master>)`` and
observes each node through a plain client of its own, flushed before the test.
Round trips are counted per node, client-side: the cluster builds each node's
connections from its own connection kwargs, so a connection class that records
what it sends, keyed by its port, sees every command and pipeline as it goes
out (tests.helpers.CountingConnection), and so do the wait connections made
from those pools' settings.  Timings use time.monotonic().
"""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from celery_redislock import (
    BackendUnavailable,
    Lock,
    LockError,
    LockLost,
    LockTimeout,
    ReadWriteLock,
    Semaphore,
)
from celery_redislock.primitives import _keeper as renewal
from celery_redislock.primitives import reap
from celery_redislock.tasks import parking
from tests.cluster import LocalCluster
from tests.cluster import unavailable as cluster_unavailable
from tests.helpers import (
    Attempt,
    Command,
    CountingConnection,
    RoundTrips,
    blocked_clients,
    collect_earlier_garbage,
    fork_context,
    keys_of,
    peak_overlap,
    running,
    server_ms,
    sha,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("no_leaked_leases")

Nodes = dict[int, redis.Redis]


# -- fixtures and helpers ------------------------------------------------------


@pytest.fixture
def nodes(redis_cluster: LocalCluster) -> Iterator[Nodes]:
    """A plain client on each master, by port; every node flushed first."""
    clients = {port: redis.Redis(port=port) for port in redis_cluster.ports}
    for client in clients.values():
        client.flushall()
    yield clients
    for client in clients.values():
        client.close()


@pytest.fixture
def rc(redis_cluster: LocalCluster, nodes: Nodes) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0])
    yield client
    client.close()


def counting_cluster(cluster: LocalCluster) -> tuple[RedisCluster, dict[int, RoundTrips]]:
    """A RedisCluster whose round trips are recorded per node, by port."""
    trips = {port: RoundTrips() for port in cluster.ports}

    class PerNode(CountingConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, round_trips=trips[int(kwargs["port"])], **kwargs)

    # (Given a URL, the cluster builds each node's pool from its kwargs, so
    # the pool makes PerNode connections.)
    url = f"redis://127.0.0.1:{cluster.ports[0]}"
    return RedisCluster.from_url(url, connection_class=PerNode), trips


def port_of(rc: RedisCluster, key: str) -> int:
    """The port of the master that owns ``key``'s slot."""
    return int(rc.get_node_from_key(key).port)


def names_on_every_node(rc: RedisCluster, per_node: int, prefix: str) -> list[str]:
    """Lock names, ``per_node`` of them owned by each master."""
    found: dict[int, list[str]] = {}
    i = 0
    while min((len(v) for v in found.values()), default=0) < per_node or len(found) < 3:
        name = f"{prefix}-{i}"
        names = found.setdefault(port_of(rc, Lock(rc, name).key), [])
        if len(names) < per_node:
            names.append(name)
        i += 1
    return [name for names in found.values() for name in names]


def scripts_sent(trips: RoundTrips, name: str) -> list[list[Command]]:
    """The round trips that carried an EVALSHA of script ``name``."""
    return [
        send
        for send in trips.sends
        if any(c[0].upper() == b"EVALSHA" and c[1] == sha(name) for c in send)
    ]


def waits_and_scripts(trips: RoundTrips) -> list[list[str]]:
    """Command names per round trip, of those round trips that ran a script or waited."""
    return [
        names
        for names in trips.names()
        if any(n in ("EVALSHA", "EVAL", "BLPOP", "SCRIPT") for n in names)
    ]


def all_keys(nodes: Nodes) -> dict[int, list[bytes]]:
    return {port: sorted(node.keys("*")) for port, node in nodes.items()}


def next_tick(k: renewal.Keeper) -> None:
    """Return just after the keeper's next renewal tick has come back."""
    ticked = k.round_trips
    wait_until(lambda: k.round_trips > ticked, 2, what="a renewal tick")
    time.sleep(0.05)


# -- renewal -------------------------------------------------------------------


def test_renewal_keeps_a_lock_past_its_ttl_one_round_trip_per_tick(
    redis_cluster: LocalCluster, nodes: Nodes, lost_events: list[tuple[Any, str]]
) -> None:
    client, trips = counting_cluster(redis_cluster)
    lock = Lock(client, "renewed", ttl=0.6)
    owner = port_of(client, lock.key)
    k = renewal.keeper()
    before = k.round_trips
    assert lock.acquire(blocking=False)
    owned, pttls = [], []
    deadline = time.monotonic() + 2.0  # more than three leases
    while time.monotonic() < deadline:
        owned.append(lock.owned())
        pttls.append(nodes[owner].pttl(lock.key))
        time.sleep(0.03)
    ticks = k.round_trips - before
    renewals = {port: scripts_sent(t, "lock_extend") for port, t in trips.items()}
    lock.release()
    client.close()

    assert lost_events == []
    assert lock.lost is False
    assert len(owned) > 30 and all(owned)
    # Unrenewed the key would be gone after 0.6 s; renewed every 0.2 s its
    # lease never drops much below 0.4 s.
    assert min(pttls) > 150
    assert 6 <= ticks <= 12
    # Every renewal went to the node that owns the lock, one command a tick
    # (one more when that node did not know the script yet).
    assert all(renewals[port] == [] for port in redis_cluster.ports if port != owner)
    assert ticks - 1 <= len(renewals[owner]) <= ticks + 1
    assert all(len(send) == 1 for send in renewals[owner])
    assert nodes[owner].exists(lock.key) == 0


def test_60_locks_on_every_node_are_renewed_with_one_pipeline_per_node_per_tick(
    redis_cluster: LocalCluster, nodes: Nodes, lost_events: list[tuple[Any, str]]
) -> None:
    client, trips = counting_cluster(redis_cluster)
    locks = [Lock(client, f"many-{i}", ttl=0.6) for i in range(60)]
    owner = {lock.name: port_of(client, lock.key) for lock in locks}
    by_node = {port: [lk for lk in locks if owner[lk.name] == port] for port in nodes}
    assert all(len(held) >= 10 for held in by_node.values())  # spread over all three
    for lock in locks:
        assert lock.acquire(blocking=False)
    k = renewal.keeper()
    next_tick(k)  # (the first tick may have had to load the script on a node)
    before = k.round_trips
    for t in trips.values():
        t.reset()
    lowest = 10_000
    deadline = time.monotonic() + 1.3  # more than two leases
    while time.monotonic() < deadline:
        for port, held in by_node.items():
            pipe = nodes[port].pipeline(transaction=False)
            for lock in held:
                pipe.pttl(lock.key)
            lowest = min(lowest, *pipe.execute())
        time.sleep(0.02)
    next_tick(k)
    ticks = k.round_trips - before
    sends = {port: t.sends for port, t in trips.items()}
    owned = [lock.owned() for lock in locks]
    for lock in locks:
        lock.release()
    client.close()

    assert lost_events == []
    assert owned == [True] * 60
    assert lowest > 150  # every lease was refreshed every tick
    assert 5 <= ticks <= 10
    # Nothing else used this client: on each node, every round trip was one
    # whole tick, a single pipeline renewing exactly that node's locks.
    for port, held in by_node.items():
        assert len(sends[port]) == ticks
        for send in sends[port]:
            assert len(send) == len(held)
            assert all(c[0] == b"EVALSHA" and c[1] == sha("lock_extend") for c in send)
            assert sorted(keys_of(send)) == sorted(lock.key.encode() for lock in held)
    # Nothing left behind on any node but the fence keys.
    for port, keys in all_keys(nodes).items():
        assert keys == sorted(lock.keys.fence.encode() for lock in by_node[port])


# -- hand-over -----------------------------------------------------------------


def test_blocked_waiter_thread_is_woken_by_release_blocking_on_the_owning_node(
    redis_cluster: LocalCluster, rc: RedisCluster, nodes: Nodes
) -> None:
    holder = Lock(rc, "handover", ttl=10.0)
    assert holder.acquire()
    fence = holder.fence
    owner = port_of(rc, holder.key)
    client, trips = counting_cluster(redis_cluster)
    waiter = Lock(client, "handover", ttl=10.0)
    attempt = Attempt(waiter, timeout=10)
    attempt.start()
    wait_until(lambda: blocked_clients(nodes[owner]) == 1, 5, what="the waiter to block")
    time.sleep(0.3)  # blocked, it sends nothing more
    during = {port: waits_and_scripts(t) for port, t in trips.items()}
    blocked = {port: blocked_clients(node) for port, node in nodes.items()}
    released_at = time.monotonic()
    holder.release()
    attempt.join(5)

    assert attempt.ok is True
    assert 0 <= attempt.at - released_at < 0.05
    assert waiter.fence is not None and fence is not None and waiter.fence > fence
    assert blocked == {port: int(port == owner) for port in nodes}
    assert during == {port: [["EVALSHA"], ["BLPOP"]] if port == owner else [] for port in nodes}
    assert nodes[owner].get(waiter.key) == waiter.token.encode()  # type: ignore[union-attr]
    waiter.release()
    client.close()


def _wait_in_child(port: int, name: str, conn: Any) -> None:
    client = RedisCluster(host="127.0.0.1", port=port)
    lock = Lock(client, name, ttl=10.0, owner="proc-waiter-")
    ok = lock.acquire(timeout=10)
    conn.send((ok, time.monotonic(), lock.fence))
    lock.release()
    client.close()


def test_blocked_waiter_in_another_process_is_woken_by_release(
    redis_cluster: LocalCluster, rc: RedisCluster, nodes: Nodes
) -> None:
    holder = Lock(rc, "proc-handover", ttl=10.0)
    assert holder.acquire()
    fence = holder.fence
    owner = port_of(rc, holder.key)
    ctx = fork_context()
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(
        target=_wait_in_child, args=(redis_cluster.ports[0], "proc-handover", child_end)
    )
    with running([proc]):
        wait_until(lambda: blocked_clients(nodes[owner]) == 1, 5, what="the waiter to block")
        queued = nodes[owner].zrange(holder.keys.queue, 0, -1)
        released_at = time.monotonic()
        holder.release()
        assert parent_end.poll(5)
        ok, granted_at, waiter_fence = parent_end.recv()
        proc.join(5)
    assert proc.exitcode == 0
    assert len(queued) == 1 and queued[0].startswith(b"proc-waiter-")
    assert ok is True
    assert 0 <= granted_at - released_at < 0.05
    assert fence is not None and waiter_fence > fence
    assert nodes[owner].exists(holder.key, holder.keys.queue) == 0


# -- semaphore and read-write lock ---------------------------------------------


def test_semaphore_of_2_with_5_threads_never_has_more_than_2_holders(
    rc: RedisCluster, nodes: Nodes, lost_events: list[tuple[Any, str]]
) -> None:
    spans: list[tuple[float, float]] = []
    fences: list[int] = []
    done: list[bool] = []
    guard = threading.Lock()

    def worker() -> None:
        sem = Semaphore(rc, "sem", 2, ttl=0.5)
        if not sem.acquire(timeout=10):
            return
        start = time.monotonic()
        time.sleep(0.6)  # longer than the lease: renewal keeps the permit
        end = time.monotonic()
        with guard:
            spans.append((start, end))
            fences.append(sem.fence)  # type: ignore[arg-type]
            done.append(not sem.lost and sem.owned())
        sem.release()

    threads = [threading.Thread(target=worker) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)

    assert done == [True] * 5
    assert peak_overlap(spans) == 2
    assert len(set(fences)) == 5
    assert lost_events == []
    assert Semaphore(rc, "sem", 2).holders() == 0


def test_read_write_lock_readers_overlap_and_a_writer_excludes(
    rc: RedisCluster, nodes: Nodes
) -> None:
    rw = ReadWriteLock(rc, "rw", ttl=10.0)
    owner = nodes[port_of(rc, rw.keys.holders)]
    readers = [rw.read() for _ in range(3)]
    for reader in readers:
        assert reader.acquire(blocking=False)  # readers share it
    assert rw.holders() == 3
    reader_fences = [reader.fence for reader in readers]
    writer = Attempt(rw.write(), timeout=10)
    writer.start()
    wait_until(lambda: blocked_clients(owner) == 1, 5, what="the writer to block")
    late = Attempt(rw.read(), timeout=10)  # behind the waiting writer: it waits too
    late.start()
    wait_until(lambda: blocked_clients(owner) == 2, 5, what="the late reader to block")
    assert writer.ok is None and late.ok is None
    for reader in readers[:-1]:
        reader.release()
    time.sleep(0.1)
    assert writer.ok is None  # one reader still holds
    last_reader_out = time.monotonic()
    readers[-1].release()
    writer.join(5)
    assert writer.ok is True and writer.at >= last_reader_out
    assert rw.write_locked() and rw.holders() == 1
    time.sleep(0.2)
    assert late.ok is None  # excluded while the writer holds
    writer_fence = writer.hold.fence
    writer_out = time.monotonic()
    writer.hold.release()
    late.join(5)
    late_fence = late.hold.fence
    late.hold.release()

    assert late.ok is True and late.at >= writer_out
    assert max(reader_fences) < writer_fence < late_fence  # type: ignore[operator]
    assert rw.holders() == 0 and not rw.write_locked()


# -- parking -------------------------------------------------------------------


def test_parked_entry_is_handed_over_by_release_and_recovered_after_a_lost_hand_over(
    rc: RedisCluster, nodes: Nodes
) -> None:
    handed: list[tuple[str, bytes]] = []
    reserve = 0.3
    holder = parking.configure(Lock(rc, "parked", ttl=10.0), reserve, handed.extend)
    node = nodes[port_of(rc, holder.key)]
    k = holder.keys
    assert holder.acquire(blocking=False)
    parker = parking.configure(Lock(rc, "parked", ttl=10.0), reserve, handed.extend)
    assert parker.park("task-1|p", b"payload-1") == "parked"
    assert node.hgetall(k.pmsg) == {b"task-1|p": b"payload-1"}
    holder.release()
    assert handed == [("task-1|p", b"payload-1")]

    # The re-published run claims its grant; a second delivery is a duplicate.
    run = Lock(rc, "parked", ttl=10.0)
    assert run.park("task-1|p", b"payload-1", parked_run=True) == "held"
    again = Lock(rc, "parked", ttl=10.0)
    assert again.park("task-1|p", b"payload-1", parked_run=True) == "duplicate"

    # A hand-over lost with its releaser (here: a release with no on_handoff)
    # is re-granted by recover() once its reservation lapses.
    second = parking.configure(Lock(rc, "parked", ttl=10.0), reserve, handed.extend)
    assert second.park("task-2|p", b"payload-2") == "parked"
    run.release()
    lapses = node.zscore(k.inflight, "task-2|p")
    assert lapses is not None and len(handed) == 1
    sweeper = parking.configure(Lock(rc, "parked", renew=False), reserve, handed.extend)
    assert sweeper.recover() > server_ms(node)  # reserved: nothing to do yet
    assert len(handed) == 1
    wait_until(lambda: server_ms(node) > lapses, 2, what="the reservation to lapse")
    assert sweeper.recover() > 0
    assert handed[1:] == [("task-2|p", b"payload-2")]

    rerun = Lock(rc, "parked", ttl=10.0)
    assert rerun.park("task-2|p", b"payload-2", parked_run=True) == "held"
    rerun.release()
    assert sweeper.recover() == -1  # nothing parked any more
    assert node.exists(k.lock, k.queue, k.meta, k.pmsg, k.inflight) == 0


# -- resharding, wait connections ------------------------------------------------


def test_resharding_a_held_lock_keeps_its_renewal_and_moves_its_waiter(
    redis_cluster: LocalCluster, nodes: Nodes, lost_events: list[tuple[Any, str]]
) -> None:
    client, trips = counting_cluster(redis_cluster)
    holder = Lock(client, "resharded", ttl=0.6)
    assert holder.acquire()
    fence = holder.fence
    slot = key_slot(holder.key.encode())
    source = port_of(client, holder.key)
    target = next(port for port in redis_cluster.ports if port != source)
    other = RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0])
    waiter = Lock(other, "resharded", ttl=10.0)
    attempt = Attempt(waiter, timeout=10)
    attempt.start()
    wait_until(lambda: blocked_clients(nodes[source]) == 1, 5, what="the waiter to block")
    next_tick(renewal.keeper())
    for t in trips.values():
        t.reset()
    redis_cluster.move_slot(slot, target)  # the holder's client is not told
    # Redis answers the blocked BLPOP with MOVED; the waiter asks again.
    wait_until(lambda: blocked_clients(nodes[target]) == 1, 5, what="the waiter to move")
    time.sleep(1.0)  # more than a lease, renewed on the new owner only
    renewals = {port: len(scripts_sent(t, "lock_extend")) for port, t in trips.items()}
    owned = holder.owned()
    holder.release()
    attempt.join(5)
    waiter_fence = waiter.fence
    token = waiter.token
    waiter.release()
    client.close()
    other.close()

    assert lost_events == []
    assert owned is True
    assert attempt.ok is True
    assert fence is not None and waiter_fence is not None and waiter_fence > fence
    assert token is not None and token.startswith(waiter.owner)
    # One tick went to the old owner: its pipeline was answered MOVED, and so
    # was the cluster's first try of the call sent on alone; every later tick
    # went to the new owner.
    assert renewals[source] <= 2
    assert renewals[target] >= 4
    assert nodes[source].execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0


def test_a_closed_cluster_client_is_collected_with_its_wait_connection(
    redis_cluster: LocalCluster, nodes: Nodes
) -> None:
    collect_earlier_garbage()
    name = "collected-client"
    client = RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0], client_name=name)
    holder = Lock(client, "collected", ttl=10.0, renew=False)  # (the keeper: see below)
    assert holder.acquire()
    owner = nodes[port_of(client, holder.key)]

    def waits() -> list[Any]:
        # The wait's own connection (which the give-up after it used last).
        own = ("blpop", "evalsha")
        return [c for c in owner.client_list() if c["name"] == name and c["cmd"] in own]

    assert Lock(client, "collected", ttl=10.0).acquire(timeout=0.1) is False
    kept = len(waits())  # idle, kept for the next wait
    holder.release()
    collected = weakref.ref(client)
    client.close()
    del client, holder
    gc.collect()

    assert kept >= 1
    # Nothing of this module keeps the client (a renewed lease would be, by
    # the keeper, until its next pass).
    assert collected() is None
    wait_until(lambda: waits() == [], 2, what="the wait connection to close")


# -- NOSCRIPT, timeouts --------------------------------------------------------


def test_flushed_scripts_are_loaded_again_on_each_node(
    rc: RedisCluster, nodes: Nodes, lost_events: list[tuple[Any, str]]
) -> None:
    names = names_on_every_node(rc, 2, "noscript")
    shas = [sha(name) for name in ("lock_acquire", "lock_extend", "lock_release")]

    def flush() -> None:
        for node in nodes.values():
            node.script_flush()
            assert node.script_exists(*shas) == [False, False, False]

    flush()
    locks = [Lock(rc, name, ttl=0.6) for name in names]
    for lock in locks:
        assert lock.acquire(blocking=False)
    flush()  # the renewals find no script on any node
    time.sleep(1.3)  # more than two leases
    owned = [lock.owned() for lock in locks]
    loaded = [node.script_exists(*shas) for node in nodes.values()]
    flush()
    for lock in locks:
        lock.release()

    assert owned == [True] * len(locks)
    assert lost_events == []
    assert loaded == [[False, True, False]] * 3  # renewal loaded it on every node
    assert all(node.script_exists(shas[2]) == [True] for node in nodes.values())
    assert all(
        keys == [k for k in keys if k.endswith(b":fence")] for keys in all_keys(nodes).values()
    )


def test_acquire_timeout_gives_up_and_leaves_the_queue(rc: RedisCluster, nodes: Nodes) -> None:
    holder = Lock(rc, "patience", ttl=10.0, owner="holder-")
    assert holder.acquire()
    node = nodes[port_of(rc, holder.key)]
    lock = Lock(rc, "patience", ttl=10.0)
    started = time.monotonic()
    assert lock.acquire(timeout=0.3) is False
    waited = time.monotonic() - started
    assert 0.3 <= waited < 1.0
    assert lock.token is None and lock.holder == holder.token
    assert node.exists(lock.keys.queue, lock.keys.meta) == 0
    assert node.keys(lock.keys.wake + "*") == []
    assert blocked_clients(node) == 0
    with pytest.raises(LockTimeout) as caught, Lock(rc, "patience", ttl=10.0, timeout=0.1):
        pass
    assert caught.value.holder == holder.token
    holder.release()
    assert node.exists(holder.key) == 0  # nobody was left in line to hand it to


def test_acquire_timeout_holds_when_the_owning_node_stalls(
    redis_cluster: LocalCluster, rc: RedisCluster
) -> None:
    """The owning node stops answering (SIGSTOP: a frozen VM, a long fork)
    while a waiter has a timeout: acquire(timeout=T) returns by T plus one
    connect timeout, although the cluster client itself has no socket
    timeout and would wait for as long as the node is stopped."""
    holder = Lock(rc, "stalled-node", ttl=10.0, renew=False)
    assert holder.acquire()
    (server,) = [s for s in redis_cluster.servers if s.port == port_of(rc, holder.key)]
    client = RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0])
    client.ping(target_nodes=RedisCluster.ALL_NODES)  # connected before the stall
    waiter = Attempt(Lock(client, "stalled-node", ttl=5.0), timeout=1.0)
    connect = 1.0  # (CONNECT_TIMEOUT, as the client sets none)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGSTOP)
    try:
        waiter.start()
        waiter.join(waiter.timeout + connect + 3)
        alive = waiter.is_alive()
    finally:
        server.proc.send_signal(signal.SIGCONT)
    waiter.join(10)
    client.close()
    assert not alive, "acquire(timeout=1) still waiting on the stopped node"
    assert waiter.ok is False or isinstance(waiter.error, BackendUnavailable), waiter.error
    assert waiter.seconds <= waiter.timeout + connect + 0.3, waiter.seconds
    holder.release()


@pytest.fixture(scope="module")
def replicated() -> Iterator[LocalCluster]:
    """A local cluster of 3 masters, each with one replica."""
    reason = cluster_unavailable()
    if reason:
        pytest.skip(reason)
    cluster = LocalCluster(3, replicas=1).start()
    yield cluster
    cluster.stop()


def test_wait_replicas_waits_for_the_owning_nodes_replica(
    replicated: LocalCluster, lost_events: list[Any]
) -> None:
    """On a cluster, a grant with wait_replicas=1 returns once the replica of
    the master that owns the name has it; while that replica hears nothing
    (SIGSTOP), a grant is undone and a renewal does not count."""
    rc = RedisCluster(host="127.0.0.1", port=replicated.ports[0])
    try:
        held = Lock(rc, "replicated-held", ttl=1.0, wait_replicas=1, wait_timeout_ms=500)
        assert held.acquire(blocking=False)
        master = port_of(rc, held.key)
        (replica_port,) = replicated.replica_ports[master]
        with redis.Redis(port=replica_port, single_connection_client=True) as replica:
            replica.execute_command("READONLY")  # (a replica answers reads of its slots then)
            assert replica.get(held.key) == held.token.encode()  # type: ignore[union-attr]
        # A second name on the same master, and its replica frozen.
        other = next(
            n
            for n in (f"replicated-{i}" for i in range(1000))
            if port_of(rc, Lock(rc, n).key) == master
        )
        stopped = replicated.server(replica_port).proc
        assert stopped is not None
        stopped.send_signal(signal.SIGSTOP)
        try:
            late = Lock(rc, other, ttl=5.0, wait_replicas=1, wait_timeout_ms=200)
            assert late.acquire(blocking=False) is False
            assert late.token is None
            with redis.Redis(port=master) as node:
                assert node.exists(late.key) == 0  # undone on the master
            # The master keeps extending the held lease, unacknowledged: the
            # holder is told once its last acknowledged lease has run out.
            # (The keeper tells the listeners just after it marks the lease lost.)
            wait_until(lambda: held.lost and lost_events, 3, 0.02, "the holder to be told")
            assert [lease for lease, _ in lost_events] == [held]
        finally:
            stopped.send_signal(signal.SIGCONT)
        with contextlib.suppress(LockError):
            held.release()
    finally:
        rc.close()


def test_extend_release_async_and_reap_reach_the_owning_node(
    rc: RedisCluster, nodes: Nodes
) -> None:
    lock = Lock(rc, "extended", ttl=1.0, renew=False, owner="child-7-")
    assert lock.acquire()
    node = nodes[port_of(rc, lock.key)]
    lock.extend(30.0)
    assert node.pttl(lock.key) > 25_000
    lock.release_async().wait()
    assert node.exists(lock.key) == 0
    assert lock.acquire()
    assert reap(rc, "extended", "child-7-") is True  # (a supervisor's clean-up)
    assert node.exists(lock.key) == 0
    assert reap(rc, "extended", "child-7-") is False


# -- unique keys -------------------------------------------------------------------


def test_a_unique_key_rides_on_its_lock_in_the_same_slot_and_apart_in_another(
    redis_cluster: LocalCluster, nodes: Nodes
) -> None:
    """A run's claim on its unique key is started and ended by its lock's own
    scripts when both live in one hash slot (the default: same name), and by
    calls of its own, on the key's node, when they do not."""
    from celery_redislock.primitives import keys, scripts, unique
    from celery_redislock.unique.run import UniqueRun

    rc, trips = counting_cluster(redis_cluster)
    try:
        for node in nodes.values():  # scripts loaded everywhere: no NOSCRIPT resends
            for script in ("lock_acquire", "lock_release", "unique_claim", "unique_publish"):
                node.script_load(scripts.source(script))
        # Same name, same tag: folded into the lock's two round trips.
        name = "u-same"
        key = keys.unique_key("redislock", name)
        assert unique.publish(rc, key, "A", "f", 5000).accepted
        lock = Lock(rc, name, ttl=2, renew=False)
        run = UniqueRun(rc, unique.Claim(key, "A", "f", 5000))
        run.attach(lock)
        assert run.folded
        for t in trips.values():
            t.reset()
        assert lock.acquire(blocking=False)
        run.started(lock)
        assert unique.state(rc, key).running == "A"
        assert unique.publish(rc, key, "B", "f", 5000).other == "A"
        for t in trips.values():
            t.reset()
        lock.release()
        run.ended()
        assert sum(len(scripts_sent(t, "lock_release")) for t in trips.values()) == 1
        assert sum(len(scripts_sent(t, "unique_claim")) for t in trips.values()) == 0
        assert not nodes[port_of(rc, key)].exists(key)

        # A lock elsewhere: the claim's steps go to the key's own node.
        other = next(n for n in (f"u-lock-{i}" for i in range(100))
                     if key_slot(Lock(rc, n).key.encode()) != key_slot(key.encode()))  # fmt: skip
        assert unique.publish(rc, key, "C", "s", 5000).accepted
        lock = Lock(rc, other, ttl=2, renew=False)
        run = UniqueRun(rc, unique.Claim(key, "C", "s", 5000))
        run.attach(lock)
        assert not run.folded and lock.claim is None
        assert run.superseded(parked_run=False) is None
        assert lock.acquire(blocking=False)
        run.started(lock)
        assert unique.state(rc, key).holder is None  # until_started: freed as it started
        lock.release()
        run.ended()
        assert scripts_sent(trips[port_of(rc, key)], "unique_claim")
    finally:
        rc.close()


def test_inspect_lists_and_frees_names_on_every_node(rc: RedisCluster, nodes: Nodes) -> None:
    """The inspect API scans every master, reads each name on its own node, and
    frees a name (its fence raised) through its node."""
    from celery_redislock.inspect import Inspector, Kind

    names = names_on_every_node(rc, 2, "insp")
    held = [Lock(rc, name, ttl=30, renew=False) for name in names]
    for lock in held:
        assert lock.acquire(blocking=False)
    sem = Semaphore(rc, "insp-sem", 2, renew=False)
    assert sem.acquire(blocking=False)
    inspector = Inspector(rc)
    entries = inspector.entries()
    assert sorted(e.name for e in entries if e.kind is Kind.LOCK) == sorted(names)
    assert {e.holders[0].token for e in entries if e.kind is Kind.LOCK} == {
        lock.token for lock in held
    }
    assert [e.limit for e in entries if e.kind is Kind.SEMAPHORE] == [2]
    (released,) = inspector.release(names[-1])
    assert released.fence > held[-1].fence and released.freed[0].token == held[-1].token
    assert not nodes[port_of(rc, held[-1].key)].exists(held[-1].key)
    with pytest.raises(LockLost):
        held[-1].release()
    for lock in held[:-1]:
        lock.release()
    sem.release()
