"""Where a key lives on a Redis Cluster, and following it when it moves.

The library's own connections (blocked waits, deadline-bounded calls) are
made from the pool of the node that owns a key's hash slot, outside
``RedisCluster.execute_command``.  Redis answers a command whose slot has
moved with MOVED (and ASK while it migrates); these helpers find the node to
go to next, updating the client's slot map the way redis-py does.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster

__all__ = ["REDIRECTS", "follow", "node_of", "pool_for"]

#: How many MOVED/ASK redirections one command follows before giving up.
REDIRECTS = 5


def node_of(client: Any, key: Any) -> Any:
    """The cluster node that owns ``key``'s hash slot."""
    return client.get_node_from_key(key)


def pool_for(client: Any, key: Any) -> Any:
    """The connection pool of the server that holds ``key``."""
    if isinstance(client, RedisCluster):
        return client.get_redis_connection(node_of(client, key)).connection_pool
    if isinstance(client, redis.Redis):
        return client.connection_pool
    raise TypeError(f"cannot reach the server of {key!r} through {client!r}")


def follow(client: Any, redirect: redis.exceptions.AskError) -> Any:
    """The pool of the node a MOVED/ASK reply names; a MOVED also updates the
    client's slot map, the way redis-py does on a redirected command."""
    nodes = client.nodes_manager
    if isinstance(redirect, redis.exceptions.MovedError):
        if hasattr(nodes, "move_slot"):  # redis-py >= 5.1
            nodes.move_slot(redirect)
        else:  # redis-py 5.0: applied on the next slot lookup
            nodes.update_moved_exception(redirect)  # (redis-py 5.0 only)
    node = client.get_node(host=redirect.host, port=redirect.port)
    if node is None:
        nodes.initialize()
        node = client.get_node(host=redirect.host, port=redirect.port)
    if node is None:
        raise redis.exceptions.ClusterError(f"no node at {redirect.host}:{redirect.port}")
    return client.get_redis_connection(node).connection_pool
