"""Blocking waits on a connection of the library's own (see :mod:`._own`).

A blocked BLPOP holds its connection for as long as it waits: taken from the
client's pool, it would starve a bounded pool.  Waits use own connections,
one per wait in progress, kept for the next wait once it is over.

The wait is bounded by the caller, not by the socket: the BLPOP asks Redis to
block for ``timeout`` seconds, and the reply is awaited that long plus a
margin, after which the connection is closed and the wait counts as woken by
nobody.  A stalled network never stretches a wait past its deadline.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import redis
from redis.cluster import RedisCluster

from . import _cluster, _encode, _own

__all__ = ["MARGIN", "wait_pop"]

#: How long past a BLPOP's own timeout its reply is awaited, in seconds.
MARGIN = 0.25


def wait_pop(
    client: Any, key: str, timeout: float, deadline: Optional[float] = None
) -> Optional[bytes]:
    """BLPOP ``key`` for at most ``timeout`` seconds; the value popped, or None.

    None also when no reply came within ``timeout`` plus :data:`MARGIN`, or by
    ``deadline`` (time.monotonic()) when given: the connection is then closed.
    Raises redis-py's errors when the connection cannot be made or breaks.
    On a Redis Cluster, a wait whose slot moves (Redis answers a blocked
    BLPOP with MOVED when its slot is resharded, and ASK while it migrates)
    follows the slot to its new node for the time left.
    """
    ends = time.monotonic() + max(0.0, float(timeout))
    if deadline is not None and ends > deadline - _EARLY:
        # The last wait before the caller's deadline: Redis answers a little
        # early, so its reply is read by the deadline.
        ends = max(time.monotonic(), deadline - _EARLY)
    read_by = ends + MARGIN if deadline is None else min(ends + MARGIN, deadline)
    if not isinstance(client, (redis.Redis, RedisCluster)):
        raise TypeError(f"cannot wait on {client!r}: a redis.Redis or RedisCluster is needed")
    pool, asking = _cluster.pool_for(client, key), False
    for _ in range(_cluster.REDIRECTS):
        try:
            return _pop(pool, key, ends - time.monotonic(), read_by, asking)
        except redis.exceptions.AskError as redirect:  # MOVED is a kind of ASK
            if not isinstance(client, RedisCluster):
                raise
            pool = _cluster.follow(client, redirect)
            asking = not isinstance(redirect, redis.exceptions.MovedError)
    raise redis.exceptions.ClusterError(f"BLPOP {key!r} redirected {_cluster.REDIRECTS} times")


#: How much earlier than a caller's deadline its last BLPOP ends, in seconds.
_EARLY = 0.02


def _pop(pool: Any, key: str, timeout: float, read_by: float, asking: bool) -> Optional[bytes]:
    conn = _own.take(pool)
    seconds = max(0.001, timeout)
    commands: list[tuple[Any, ...]] = [("BLPOP", key, f"{seconds:.3f}")]
    if asking:
        commands.insert(0, ("ASKING",))
    reading = False
    try:
        # connect() first, as a pool does: a Sentinel connection asks where the
        # master is now (a bare send would reconnect to the host it had).
        _own.connect(conn, read_by)
        _encode.send(conn, commands)
        # Blocked in the read itself until the reply comes, or until read_by.
        _own.read_until(conn, read_by)
        reading = True
        if asking:
            conn.read_response()
        reply = conn.read_response(disable_decoding=True)
    except redis.exceptions.ResponseError:
        raise  # an error reply leaves the connection in step
    except BaseException as exc:
        conn.disconnect()  # sent but not read: out of step
        stalled = isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError))
        if not (stalled and reading and time.monotonic() >= read_by - _TIMER_SLACK):
            raise  # broken (or interrupted), not stalled
        reply = None  # stalled: the reply, if it ever comes, is not read
    finally:
        _own.give_back(pool, conn)  # (a disconnected one reconnects on next use)
    if reply is None:
        return None
    value: bytes = reply[1]
    return value


#: How much earlier than asked a kernel receive timeout may end (it counts
#: whole timer ticks, the first of them perhaps partly gone), in seconds.
_TIMER_SLACK = 0.01
