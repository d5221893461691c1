"""The asyncio Lock through Sentinel's ``master_for`` and through a Redis Cluster.

The Sentinel topology is tests/sentinel.py's (a master, a replica, three
sentinels), the cluster tests/cluster.py's (three masters); both are started
once for the module.  Each test is one hold, one hand-over and renewal past
the lease, observed through plain clients on the servers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from celery_redislock import Lock as SyncLock
from celery_redislock.asyncio import Lock, calls, renewal
from tests.asyncio_support import CountingConnection, close, no_renewals, wait_for
from tests.cluster import LocalCluster
from tests.helpers import RoundTrips, sha
from tests.sentinel import LocalSentinel

pytestmark = pytest.mark.usefixtures("no_leaked_leases")


async def hand_over_and_renew(client: Any, name: str) -> tuple[bool, int, int, bool]:
    """A holder hands over to a waiter (woken by BLPOP on its own connection),
    which then keeps its 0.6 s lease for 1.2 s; (got, holder's fence, waiter's
    fence, still owned)."""
    holder = Lock(client, name, ttl=0.6, renew_interval=0.15)
    assert await holder.acquire()
    waiter = Lock(client, name, ttl=0.6, renew_interval=0.15)
    task = asyncio.create_task(waiter.acquire(timeout=5))
    await wait_for(lambda: client.zcard(holder.keys.queue), what="the waiter to queue")
    first = holder.fence
    await holder.release()
    got = await task
    await asyncio.sleep(1.2)
    owned, second = await waiter.owned(), waiter.fence
    await waiter.release()
    await no_renewals()
    return got, first or 0, second if second is not None else -1, owned


def test_sentinel_master_for(topology: LocalSentinel) -> None:
    async def body() -> tuple[tuple[bool, int, int, bool], Any]:
        sentinel = Sentinel(topology.sentinels, socket_timeout=1)
        client = sentinel.master_for("mymaster", socket_timeout=1)
        try:
            outcome = await hand_over_and_renew(client, "through sentinel")
            master = SyncLock(redis.Redis(port=topology.master_port()), "through sentinel")
            return outcome, int(master.client.exists(master.key))
        finally:
            await close(client)
            for each in sentinel.sentinels:
                await close(each)

    (got, first, second, owned), exists = asyncio.run(body())
    assert got and owned
    assert second > first
    assert exists == 0


async def count_per_node(client: RedisCluster) -> dict[int, RoundTrips]:
    """Record the round trips of ``client``'s connections to each node, by port,
    from now on (the nodes' connections are made anew as CountingConnection)."""
    await client.initialize()
    trips = {}
    for node in client.get_nodes():
        await node.disconnect()
        # The connections made so far (the seed node's) are dropped, so that
        # every later one is made by the counting class (redis-py 5.0 to 8
        # keep them in these two attributes).
        node._connections.clear()
        node._free.clear()
        trips[int(node.port)] = RoundTrips()
        node.connection_class = CountingConnection
        node.connection_kwargs = {**node.connection_kwargs, "round_trips": trips[int(node.port)]}
    return trips


def renewals(trips: RoundTrips) -> list[int]:
    """Per round trip that carried renewals, how many it carried."""
    counts = [
        sum(1 for c in send if c[0].upper() == b"EVALSHA" and c[1] == sha("lock_extend"))
        for send in trips.sends
    ]
    return [n for n in counts if n]


def test_cluster(redis_cluster: LocalCluster) -> None:
    for port in redis_cluster.ports:
        with redis.Redis(port=port) as node:
            node.flushall()
            node.script_flush()  # first calls load their scripts where their keys are

    async def body() -> dict[str, Any]:
        client = RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0])
        try:
            trips = await count_per_node(client)
            seen: dict[str, Any] = {}
            seen["hand-over"] = await hand_over_and_renew(client, "through cluster")
            # Two leases on every node: each round renews them all, in one
            # pipeline per node.
            names: list[str] = []
            per_node: dict[str, int] = {}
            for i in range(500):
                name = f"spread-{i}"
                node = client.get_node_from_key(Lock(client, name).key).name
                if per_node.get(node, 0) < 2:
                    per_node[node] = per_node.get(node, 0) + 1
                    names.append(name)
            locks = [Lock(client, name, ttl=0.6, renew_interval=0.2) for name in names]
            for lock in locks:
                await calls.load(client, "lock_extend", lock.key)  # (no NOSCRIPT round)
                assert await lock.acquire()
            renewer = renewal.renewer_for(client)
            for each in trips.values():
                each.reset()
            before = renewer.round_trips
            # Ends halfway between rounds (they are due 0.2 s apart from the
            # first grant), not as one is being sent.
            await asyncio.sleep(1.1)
            # (Read together, with no await between: no round goes out meanwhile.)
            seen["rounds"] = renewer.round_trips - before
            seen["renewals"] = {port: renewals(each) for port, each in trips.items()}
            seen["owned"] = [await lock.owned() for lock in locks]
            for lock in locks:
                await lock.release()
            await no_renewals()
            return seen
        finally:
            await close(client)

    seen = asyncio.run(body())
    got, first, second, owned = seen["hand-over"]
    assert got and owned and second > first
    assert seen["owned"] == [True] * 6
    rounds = seen["rounds"]
    assert 3 <= rounds <= 6, rounds
    # Every node: one round trip per round, carrying both of its leases.
    assert list(seen["renewals"].values()) == [[2] * rounds] * 3, seen
