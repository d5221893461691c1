"""One script call, one round trip once the script is loaded.

Three kinds of client, told apart once per call by their type:

- a ``redis.Redis`` with a connection pool (plain, TLS, unix socket, Sentinel's
  ``master_for``, a ``BlockingConnectionPool``): a round trip on a connection
  of its pool (:mod:`._roundtrip`);
- a ``redis.cluster.RedisCluster``: ``execute_command`` (:mod:`._execute`),
  or, bounded by a deadline, a round trip on a connection of the library's
  own to the node that owns the keys, following MOVED;
- anything else with ``execute_command``: ``execute_command``.

Every reply is read undecoded (``decode_responses`` does not apply): the
scripts return bytes the primitives parse, and parked task payloads may not
be text.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError

from . import _cluster
from ._checkout import pool_of
from ._encode import KeyBlock, prepack
from ._execute import execute, execute_and_wait
from ._noscript import loaded_one
from ._roundtrip import roundtrip

__all__ = ["call", "packed_call"]

#: Script is a redis-py ``Script`` (or anything with ``sha`` and ``script``).
Script = Any


def packed_call(client: Any, script: Script, block: KeyBlock, args: list[Any]) -> Any:
    """The call of ``script`` on ``block``'s keys with ``args``, ready for
    :func:`call`'s ``packed``: packed now where the client sends through a
    pool (:func:`._encode.prepack`), else its arguments."""
    command = block.evalsha(script.sha, args)
    pool = pool_of(client)
    return command if pool is None else prepack(pool, command)


def call(
    client: Any,
    script: Script,
    block: KeyBlock,
    args: list[Any],
    *,
    packed: Any = None,
    sends: Optional[list[int]] = None,
    deadline: Optional[float] = None,
    replicas: Optional[tuple[int, int]] = None,
) -> Any:
    """Run ``script`` on ``block``'s keys with ``args``: one round trip once loaded.
    ``packed``, when given, is :func:`packed_call`'s (or ``block.evalsha``'s) made earlier.

    Error replies raise as redis-py raises them; NOSCRIPT (a restarted or
    flushed server) loads the script and sends the call again.  ``sends``,
    when given, gets one item per time the call went out after a connection
    failure could have let an earlier one run (the client's retry policy).

    ``deadline`` (time.monotonic()) bounds the call: a reply not read by then
    raises TimeoutError, and a failed try is sent again only while time is
    left, instead of under the client's retry policy.  Connecting is bounded
    by the connection's own timeouts.

    ``replicas`` ``(n, timeout_ms)``: ``WAIT n timeout_ms`` goes out right
    after the call, on the same connection and in the same round trip; the
    result is then ``(reply, replicas that acknowledged)``.
    """
    pool = pool_of(client)
    if pool is None and deadline is not None and isinstance(client, RedisCluster):
        return _on_node_by(client, script, block, args, sends, deadline, replicas)
    if pool is None:
        if sends is not None:
            sends.append(1)
        if replicas is not None:
            return execute_and_wait(client, script, block, args, replicas)
        return execute(client, script, block, args)
    if packed is None:
        packed = block.evalsha(script.sha, args)
    return _on_pool(pool, script, packed, sends, deadline, replicas, client.script_load)


def _on_pool(
    pool: Any,
    script: Script,
    packed: Any,
    sends: Optional[list[int]],
    deadline: Optional[float],
    replicas: Optional[tuple[int, int]],
    load: Callable[[Any], Any],
) -> Any:
    """The call (and its WAIT) in one round trip on a connection of ``pool``:
    the reply, or ``(reply, replicas that acknowledged)`` with ``replicas``."""
    wait = None if replicas is None else ("WAIT", *replicas)

    def send() -> list[Any]:
        return roundtrip(pool, packed, sends, deadline, wait)

    def load_script(script: Script) -> None:
        if sends is not None:
            sends.clear()  # an unknown script ran nothing
        load(script.script)

    replies = loaded_one(send, script, load_script)
    return replies[0] if wait is None else (replies[0], int(replies[1]))


def _on_node_by(
    client: Any,
    script: Script,
    block: KeyBlock,
    args: list[Any],
    sends: Optional[list[int]],
    deadline: float,
    replicas: Optional[tuple[int, int]],
) -> Any:
    """:func:`call` bounded by ``deadline`` on a cluster: on a connection of
    the library's own to the node that owns the keys (``execute_command``
    would wait on a stalled node for as long as its socket timeout, and
    retry under the cluster's policy), following MOVED while time is left."""
    packed = block.evalsha(script.sha, args)
    pool = _cluster.pool_for(client, block.keys[0])
    for _ in range(_cluster.REDIRECTS):
        load = functools.partial(_load_on, pool)
        try:
            return _on_pool(pool, script, packed, sends, deadline, replicas, load)
        except MovedError as redirect:
            pool = _cluster.follow(client, redirect)
        except AskError:
            break  # a slot in migration: through the cluster's redirects
    if replicas is not None:
        return execute_and_wait(client, script, block, args, replicas)
    return execute(client, script, block, args)


def _load_on(pool: Any, text: Any) -> Any:
    """SCRIPT LOAD on the server of ``pool`` (a cluster node's)."""
    return redis.Redis(connection_pool=pool).script_load(text)
