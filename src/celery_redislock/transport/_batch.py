"""Many script calls at once, one round trip per server (the keeper's renewals).

The calls go out as one non-transactional pipeline of the client's own
(:func:`._execute.pipelined`); on a Redis Cluster, one per node that owns
some of their keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, TryAgainError

from . import _cluster
from ._checkout import pool_of
from ._errors import NotReplicated
from ._execute import Call, execute, execute_and_wait, pipelined

__all__ = ["call_batch"]


def call_batch(
    client: Any, calls: Sequence[Call], replicas: Optional[tuple[int, int]] = None
) -> list[Any]:
    """Run every call, one round trip per server; each result is the reply or
    the exception that call ended with (an error reply, or the connection's
    failure for every call that went to that server).  ``replicas`` ``(n,
    timeout_ms)`` ends each server's pipeline with ``WAIT``; a call that ran
    where fewer than ``n`` replicas acknowledged ends with NotReplicated."""
    if isinstance(client, RedisCluster):
        return _by_node(client, calls, replicas)
    if pool_of(client) is None:
        return [_alone(client, one, replicas) for one in calls]
    replies, _ = pipelined(client, calls, replicas)
    return replies


def _by_node(
    client: RedisCluster, calls: Sequence[Call], replicas: Optional[tuple[int, int]]
) -> list[Any]:
    """One pipeline per node; a call whose slot moved meanwhile goes alone."""
    results: list[Any] = [None] * len(calls)
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, (_, block, _) in enumerate(calls):
        node = _cluster.node_of(client, block.keys[0])
        groups.setdefault(node.name, (node, []))[1].append(i)
    for node, indexes in groups.values():
        target = client.get_redis_connection(node)
        replies, _ = pipelined(target, [calls[i] for i in indexes], replicas)
        for i, reply in zip(indexes, replies):
            results[i] = reply
    for i, result in enumerate(results):
        if isinstance(result, (MovedError, AskError, TryAgainError)):
            # Resharding: this one goes alone, through the cluster's redirects.
            results[i] = _alone(client, calls[i], replicas)
    return results


def _alone(client: Any, one: Call, replicas: Optional[tuple[int, int]]) -> Any:
    """One call through ``execute_command``: its reply, or what it ended with."""
    try:
        if replicas is None:
            return execute(client, *one)
        reply, acked = execute_and_wait(client, *one, replicas)
        return reply if acked >= replicas[0] else NotReplicated(acked, replicas[0], reply)
    except Exception as exc:
        return exc
