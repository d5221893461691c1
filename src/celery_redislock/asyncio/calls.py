"""Script calls through the caller's ``redis.asyncio`` client: the one place
the asyncio primitives send a script.

A call is EVALSHA through the client's own ``execute_command``, so its pool,
retry policy, Sentinel discovery and cluster routing apply, with the reply
read undecoded (``NEVER_DECODE``: the scripts return bytes the protocol
parses, whatever ``decode_responses`` says).  NOSCRIPT (a restarted or
flushed server) loads the script and sends the call again; on a cluster the
script is loaded on the node that owns the call's keys.  Renewals go out as
one pipeline, which a cluster client splits into one per node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Optional

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from ..primitives import scripts as sources  # the one import of the scripts
from ..primitives.protocol import Call
from ..transport import DeadlineExceeded

__all__ = [
    "CONNECT_TIMEOUT",
    "connect_timeout",
    "load",
    "run",
    "run_batch",
]

#: Connect timeout assumed where the client sets none, in seconds.
CONNECT_TIMEOUT = 1.0


def connect_timeout(client: Any) -> float:
    """How long connecting one of ``client``'s connections may take, in seconds."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or getattr(client, "connection_kwargs", {})
    return float(kwargs.get("socket_connect_timeout") or CONNECT_TIMEOUT)


def _command(call: Call) -> tuple[Any, ...]:
    script = sources.get(call.script)
    return ("EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)


def _node(client: Any, key: str) -> Any:
    """The cluster node that owns ``key``'s hash slot."""
    return client.get_node_from_key(key)


async def load(client: Any, name: str, key: str) -> None:
    """SCRIPT LOAD script ``name`` where ``key`` lives."""
    text = sources.get(name).script
    if isinstance(client, RedisCluster):
        node = _node(client, key)
        await client.execute_command("SCRIPT LOAD", text, target_nodes=node)
    else:
        await client.script_load(text)


async def _run(client: Any, call: Call) -> Any:
    command = _command(call)
    try:
        return await client.execute_command(*command, NEVER_DECODE=True)
    except NoScriptError:
        await load(client, call.script, call.keys[0])
        return await client.execute_command(*command, NEVER_DECODE=True)


async def run(client: Any, call: Call, deadline: Optional[float] = None) -> Any:
    """The undecoded reply of ``call``: one round trip once the script is loaded.

    ``deadline`` (time.monotonic()) bounds it: no reply by then raises
    :class:`~celery_redislock.transport.DeadlineExceeded` (the call is
    cancelled, and redis-py closes a connection left waiting for a reply).
    """
    if deadline is None:
        return await _run(client, call)
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("no time left for the call")
    try:
        return await asyncio.wait_for(_run(client, call), left)
    except asyncio.TimeoutError as exc:
        raise DeadlineExceeded(f"no reply within {left:.3f} s") from exc


async def _pipeline(client: Any, calls: Sequence[Call]) -> list[Any]:
    pipe = client.pipeline() if isinstance(client, RedisCluster) else client.pipeline(False)
    for call in calls:
        pipe.execute_command(*_command(call), NEVER_DECODE=True)
    try:
        return list(await pipe.execute(raise_on_error=False))
    except Exception as exc:  # the connection failed: every call with it
        return [exc] * len(calls)


async def run_batch(client: Any, calls: Sequence[Call]) -> list[Any]:
    """Every call in one pipeline (one round trip per server); each result is
    the reply, or the exception that call ended with."""
    results = await _pipeline(client, calls)
    missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
    if missing:
        loaded = set()
        for i in missing:
            name, key = calls[i].script, calls[i].keys[0]
            where = _node(client, key).name if isinstance(client, RedisCluster) else ""
            if (name, where) not in loaded:
                loaded.add((name, where))
                await load(client, name, key)
        again = await _pipeline(client, [calls[i] for i in missing])
        for i, result in zip(missing, again):
            results[i] = result
    return results
