"""Script calls through the client's own commands: ``execute_command`` and pipelines.

For a client whose connections a call cannot borrow (see
:func:`._checkout.pool_of`):

- a ``redis.cluster.RedisCluster``: ``execute_command`` routes by the keys'
  hash slot and follows MOVED and ASK; a pipeline goes to the node that owns
  the keys, on that node's own client;
- anything else with ``execute_command`` (a single-connection client, a
  client-side caching pool, a subclass with its own ``execute_command``).

Batches (:func:`pipelined`) go this way for every client: a non-transactional
pipeline, one round trip per server.  Replies are read undecoded
(``NEVER_DECODE``), as everywhere in the transport.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

from redis.cluster import RedisCluster
from redis.exceptions import ReadOnlyError, ResponseError

from . import _cluster
from ._encode import KeyBlock
from ._errors import UNREACHABLE, NotReplicated, drop_demoted, translated
from ._noscript import loaded, loaded_one

__all__ = ["Call", "execute", "execute_and_wait", "pipelined", "server_of"]

#: Script is a redis-py ``Script`` (or anything with ``sha`` and ``script``).
Script = Any
#: One script call: (script, keys, args).
Call = tuple[Script, KeyBlock, list[Any]]


def server_of(client: Any, block: KeyBlock) -> Any:
    """The client that talks to the one server holding ``block``'s keys:
    on a cluster, the owning node's; otherwise ``client`` itself."""
    if isinstance(client, RedisCluster):
        return client.get_redis_connection(_cluster.node_of(client, block.keys[0]))
    return client


def execute(client: Any, script: Script, block: KeyBlock, args: list[Any]) -> Any:
    """The call through ``client.execute_command``; NOSCRIPT loads the script
    on the server that owns the keys (on a cluster, SCRIPT LOAD would go to a
    node of redis-py's choosing) and sends it once more."""
    command = block.evalsha(script.sha, args)

    def send() -> Any:
        try:
            return client.execute_command(*command, NEVER_DECODE=True)
        except ResponseError as exc:
            error = translated(exc)
            if error is exc:
                raise
            raise error from exc

    return loaded_one(send, script, _loader(client, block))


def execute_and_wait(
    client: Any, script: Script, block: KeyBlock, args: list[Any], replicas: tuple[int, int]
) -> tuple[Any, int]:
    """The call and ``WAIT n timeout_ms`` in one pipeline, on one connection
    (the owning node's, on a cluster), so WAIT counts that call's writes:
    the reply and how many replicas acknowledged.  An error reply raises."""
    target = server_of(client, block)
    [reply], acked = pipelined(target, [(script, block, args)], replicas)
    if isinstance(reply, NotReplicated):
        return reply.reply, reply.acked
    if isinstance(reply, BaseException):
        raise reply
    return reply, acked or 0


def pipelined(
    client: Any, calls: Sequence[Call], replicas: Optional[tuple[int, int]] = None
) -> tuple[list[Any], Optional[int]]:
    """``calls`` in one non-transactional pipeline on ``client`` (a ``redis.Redis``
    of one server): each reply, or the exception that call ended with (an error
    reply, or the connection's failure).  ``replicas`` ``(n, timeout_ms)`` ends
    the pipeline with ``WAIT``; a call that ran where fewer than ``n`` replicas
    acknowledged ends with :class:`NotReplicated`.  Also returned: how many
    acknowledged the last pipeline sent (None without ``replicas``)."""
    acked: list[Optional[int]] = [None]

    def send(indexes: list[int]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for i in indexes:
            script, block, args = calls[i]
            pipe.execute_command(*block.evalsha(script.sha, args), NEVER_DECODE=True)
        if replicas is not None:
            pipe.execute_command("WAIT", *replicas)
        try:
            replies = pipe.execute(raise_on_error=False)
        except UNREACHABLE as exc:
            return [exc] * len(indexes)
        replies = [translated(r) if isinstance(r, ResponseError) else r for r in replies]
        if replicas is not None:
            count = replies.pop()
            acked[0] = count = count if isinstance(count, int) else 0
            if count < replicas[0]:
                replies = [
                    r if isinstance(r, Exception) else NotReplicated(count, replicas[0], r)
                    for r in replies
                ]
        return replies

    def load(script: Script) -> None:
        client.script_load(script.script)

    replies = loaded(send, [script for script, _, _ in calls], load)
    if any(isinstance(reply, ReadOnlyError) for reply in replies):
        drop_demoted(client)
    return replies, acked[0]


def _loader(client: Any, block: KeyBlock) -> Callable[[Script], Any]:
    """SCRIPT LOAD on the server that owns ``block``'s keys."""

    def load(script: Script) -> Any:
        return server_of(client, block).script_load(script.script)

    return load
