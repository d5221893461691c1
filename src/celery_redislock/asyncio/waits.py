"""Waiting for a hand-over: BLPOP on a connection of the waiter's own.

:func:`wait_for_grant` is a blocking acquire's loop, as the sync driver runs
it: ask (queueing), wait for the wake-up a release pushes, and when the wait
ends without one (the holder's lease would have run out), ask again, keeping
the place in line; give up (leaving the line) at the caller's deadline.

A blocked BLPOP holds its connection for as long as it waits.  Taken from
the client's pool, it would starve a bounded pool (``BlockingConnectionPool``,
``max_connections``, a cluster node's limit), where waiters would hold every
connection while the holders they wait for could not renew or release.  So
each blocking acquire makes one connection of its own, with the pool's
connection class and settings (TLS, auth; a Sentinel connection asks the
sentinels where the master is), without retries, and with a connect timeout
where the pool has none.  It serves every wait of that acquire and is closed
when the acquire returns: nothing is left open when the event loop ends.

The wait is bounded by the caller, not by the socket: BLPOP asks Redis to
block for the wait's time, and its reply is awaited that long plus a margin,
or until the caller's deadline; a reply that does not come by then counts as
no wake-up, and the connection, out of step, is closed.  On a cluster, a wait
whose slot has moved ends with no wake-up: the next acquire call follows the
slot, and the next wait goes to the node that owns it then.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any, Optional

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError

from ..exceptions import BackendUnavailable
from ..primitives import protocol
from ..primitives.protocol import Granted
from ..transport import UNREACHABLE, DeadlineExceeded
from .calls import CONNECT_TIMEOUT, unreachable
from .cancellation import complete

if TYPE_CHECKING:
    from .primitive import Primitive

__all__ = ["MARGIN", "Waiter", "wait_for_grant"]

#: How long past a BLPOP's own timeout its reply is awaited, in seconds.
MARGIN = 0.25
#: How much earlier than the caller's deadline its last BLPOP ends, in seconds.
_EARLY = 0.02
#: Consecutive failed waits (the wait connection broke) before acquire gives up.
_WAIT_FAILURES = 2
#: A wait that ends this close to the caller's deadline was its last one, s.
_LAST_WAIT = 0.05


def _connection_for(client: Any, key: str) -> tuple[Any, Any]:
    """A new connection to the server of ``key``, and what identifies that server."""
    if isinstance(client, RedisCluster):
        node: Any = client.get_node_from_key(key)
        cls, kwargs, where = node.connection_class, node.connection_kwargs, node.name
    else:
        pool = client.connection_pool
        cls, kwargs, where = pool.connection_class, pool.connection_kwargs, pool
    kwargs = dict(kwargs)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["socket_connect_timeout"] = kwargs.get("socket_connect_timeout") or CONNECT_TIMEOUT
    return cls(**kwargs), where


class Waiter:
    """The wake-up waits of one acquire, on one connection of its own;
    :meth:`close` when the acquire is over."""

    __slots__ = ("_conn", "_where", "client")

    def __init__(self, client: Any) -> None:
        self.client = client
        self._conn: Any = None
        self._where: Any = None

    async def pop(
        self, key: str, timeout: float, deadline: Optional[float] = None
    ) -> Optional[bytes]:
        """BLPOP ``key`` for at most ``timeout`` seconds: the value popped, or None
        (also when no reply came by ``deadline``, time.monotonic()).  Raises
        redis-py's errors when the connection cannot be made or breaks."""
        now = time.monotonic()
        ends = now + max(0.0, timeout)
        if deadline is not None and ends > deadline - _EARLY:
            # The last wait before the caller's deadline: Redis answers a
            # little early, so that its reply is read by the deadline.
            ends = max(now, deadline - _EARLY)
        read_by = ends + MARGIN if deadline is None else min(ends + MARGIN, deadline)
        conn = await self._connected(key, read_by)
        try:
            await conn.send_command("BLPOP", key, f"{max(0.001, ends - time.monotonic()):.3f}")
            left = max(0.001, read_by - time.monotonic())
            reply = await conn.read_response(disable_decoding=True, timeout=left)
        except AskError:  # (MOVED too) the slot moved: ask again, then wait there
            await self.close()
            return None
        except BaseException:
            await self.close()  # broken or interrupted: out of step
            raise
        if reply is None:
            if time.monotonic() >= read_by - 0.01:
                await self.close()  # no reply in time: it may still come
            return None
        value: bytes = reply[1]
        return value

    async def _connected(self, key: str, by: float) -> Any:
        conn, where = self._conn, self._where
        cluster = isinstance(self.client, RedisCluster)
        if conn is not None and cluster and self.client.get_node_from_key(key).name != where:
            await self.close()  # the slot moved since the last wait
            conn = None
        if conn is None:
            conn, where = _connection_for(self.client, key)
            self._conn, self._where = conn, where
        if not conn.is_connected:
            timeouts = conn.socket_connect_timeout, conn.socket_timeout
            left = max(0.001, by - time.monotonic())
            # Connecting (TCP, then the handshake) takes no longer than the wait.
            conn.socket_connect_timeout = min(timeouts[0] or left, left)
            conn.socket_timeout = min(timeouts[1] or left, left)
            try:
                await conn.connect()
            except BaseException:
                await self.close()
                raise
            finally:
                conn.socket_connect_timeout, conn.socket_timeout = timeouts
        return conn

    async def close(self) -> None:
        conn, self._conn, self._where = self._conn, None, None
        if conn is not None:
            # Without waiting for the close to finish: this runs when an
            # acquire is cancelled too.
            await conn.disconnect(nowait=True)


async def wait_for_grant(prim: Primitive, token: str, timeout: Optional[float]) -> bool:
    """The blocking acquire of ``prim`` under ``token`` once its first call is to be
    sent: ask, wait for the wake-up, ask again, until granted or out of time."""
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    # With a timeout, every call is bounded by it too (a stalled
    # connection, a reconnect), and giving up by one connect timeout more.
    by = None if timeout is None else deadline

    async def attempt() -> Optional[protocol.AcquireResult]:
        left = deadline - time.monotonic()
        if left <= 0:
            return None  # out of time: give up below
        wait = protocol.FOREVER_MS if left == math.inf else max(1, int(left * 1000))
        try:
            return await prim._attempt(token, wait, by)
        except BackendUnavailable as exc:
            if isinstance(exc.__cause__, DeadlineExceeded):
                return None  # out of time: give up below
            raise

    waiter = Waiter(prim.client)
    try:
        result = await attempt()
        failures = 0
        while not isinstance(result, Granted):
            left = deadline - time.monotonic()
            if left <= 0:
                return await prim._give_up(token)
            # Wait until a release hands over, or until the holder's lease
            # would have run out (it may have crashed); then ask again.
            block = min(left, max(prim.holder_ttl_ms or 1, 1) / 1000.0 + 0.002)
            try:
                popped = await waiter.pop(prim.keys.wake + token, block, by)
            except UNREACHABLE as exc:
                failures += 1
                if failures >= _WAIT_FAILURES:
                    await complete(prim._abandon(token))
                    raise unreachable("acquire", prim.key, exc) from exc
                popped = None
            else:
                failures = 0
            if popped is None and time.monotonic() >= deadline - _LAST_WAIT:
                # The wait ran to the deadline (ending a little early, to be
                # read by then): give up at the deadline, not before; a grant
                # made meanwhile is found by the give-up.
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
                return await prim._give_up(token)
            if popped is not None:
                fence, granted_ms = protocol.parse_wake(popped)
                start = protocol.lease_start(prim._sent, prim._server_ms, granted_ms)
                if start + prim.ttl > time.monotonic():
                    prim._granted(token, fence, start)
                    return True
                # The wake-up came too late (a stalled loop): the lease it
                # granted may have run out, and even been granted again.
                # Ask once more with the same token: a lease still ours is
                # renewed and confirmed, else we queue.
            result = await attempt()
        return True
    finally:
        await waiter.close()
