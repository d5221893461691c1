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
where the pool has none.  It serves every wait of that acquire; when the
acquire returns it is kept, idle, for the next blocking acquire of that
client in that event loop (checked as a pool checks a connection it hands
out), so neither connecting nor closing lands between a wake-up and the
acquire's return.  A task of the event loop closes the connections idle for
:data:`IDLE` seconds, and all of them when it is cancelled (``asyncio.run``
cancels it as the event loop ends); it ends when none is left.

The wait is bounded by the caller, not by the socket: BLPOP asks Redis to
block for the wait's time, and its reply is awaited that long plus a margin,
or until the caller's deadline; a reply that does not come by then counts as
no wake-up, and the connection, out of step, is closed.  On a cluster, a wait
whose slot has moved ends with no wake-up: the next acquire call follows the
slot, and the next wait goes to the node that owns it then.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import weakref
from typing import TYPE_CHECKING, Any, Optional

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..exceptions import BackendUnavailable
from ..primitives import protocol
from ..primitives.failures import unreachable
from ..primitives.protocol import Granted
from ..transport import UNREACHABLE, DeadlineExceeded
from .calls import CONNECT_TIMEOUT
from .cancellation import complete

if TYPE_CHECKING:
    from .primitive import Primitive

__all__ = ["IDLE", "MARGIN", "Waiter", "idle_connections", "wait_for_grant"]

#: How long past a BLPOP's own timeout its reply is awaited, in seconds.
MARGIN = 0.25
#: How much earlier than the caller's deadline its last BLPOP ends, in seconds.
_EARLY = 0.02
#: Consecutive failed waits (the wait connection broke) before acquire gives up.
_WAIT_FAILURES = 2
#: A wait that ends this close to the caller's deadline was its last one, s.
_LAST_WAIT = 0.05
#: How long a wait connection is kept idle for the next blocking acquire, s.
IDLE = 5.0


def _server_of(client: Any, key: str) -> Any:
    """What identifies the server of ``key`` (a cluster node's name, or the pool)."""
    if isinstance(client, RedisCluster):
        node: Any = client.get_node_from_key(key)
        return node.name
    return client.connection_pool


def _connection_for(client: Any, key: str) -> Any:
    """A new connection to the server of ``key``."""
    if isinstance(client, RedisCluster):
        node: Any = client.get_node_from_key(key)
        cls, kwargs = node.connection_class, node.connection_kwargs
    else:
        pool = client.connection_pool
        cls, kwargs = pool.connection_class, pool.connection_kwargs
    kwargs = dict(kwargs)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["socket_connect_timeout"] = kwargs.get("socket_connect_timeout") or CONNECT_TIMEOUT
    return cls(**kwargs)


class _Idle:
    """The idle wait connections of one event loop, by client and server."""

    def __init__(self) -> None:
        #: (id(client), id(server)) -> [(connection, idle since, the client, weakly)]
        self.conns: dict[tuple[int, int], list[tuple[Any, float, Any]]] = {}
        self.task: Optional[asyncio.Task[None]] = None

    def take(self, client: Any, where: Any) -> Any:
        found = self.conns.get((id(client), id(where)))
        while found:
            conn, _, ref = found.pop()
            if ref() is client:
                return conn
        return None

    def give_back(self, client: Any, where: Any, conn: Any) -> None:
        key = (id(client), id(where))
        self.conns.setdefault(key, []).append((conn, time.monotonic(), weakref.ref(client)))
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(
                self._close_idle(), name="redislock-idle-waits"
            )

    def count(self) -> int:
        return sum(len(conns) for conns in self.conns.values())

    async def _close_idle(self) -> None:
        try:
            while self.conns:
                await asyncio.sleep(IDLE)
                cutoff = time.monotonic() - IDLE
                for key, conns in list(self.conns.items()):
                    fresh = [c for c in conns if c[1] > cutoff]
                    if fresh:
                        self.conns[key] = fresh
                    else:
                        del self.conns[key]
                    for conn, since, _ in conns:
                        if since <= cutoff:
                            await _disconnect(conn)
        finally:
            self.task = None
            left, self.conns = self.conns, {}
            for conns in left.values():
                for conn, _, _ in conns:
                    await _disconnect(conn)


async def _disconnect(conn: Any) -> None:
    # Without waiting for the close to finish: this runs when an acquire is
    # cancelled, and as the event loop ends.  (Closing: an error is no news.)
    with contextlib.suppress(Exception):
        await conn.disconnect(nowait=True)


_idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Idle] = weakref.WeakKeyDictionary()


def _idle_of(loop: asyncio.AbstractEventLoop) -> _Idle:
    found = _idle.get(loop)
    if found is None:
        found = _idle[loop] = _Idle()
    return found


def idle_connections() -> int:
    """How many wait connections the running event loop keeps idle."""
    found = _idle.get(asyncio.get_running_loop())
    return 0 if found is None else found.count()


class Waiter:
    """The wake-up waits of one acquire, on one connection of its own (an
    idle one kept from an earlier acquire, or a new one); :meth:`done` when
    the acquire is over."""

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
            where = _server_of(self.client, key)
            conn = await self._idle_one(where)
            if conn is None:
                conn = _connection_for(self.client, key)
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

    async def _idle_one(self, where: Any) -> Any:
        """An idle connection to ``where`` that is still in step, or None."""
        idle = _idle.get(asyncio.get_running_loop())
        while idle is not None:
            conn = idle.take(self.client, where)
            if conn is None:
                return None
            # As a pool checks a connection it hands out: nothing unread (the
            # server did not close it meanwhile).  (can_read_destructive before
            # redis-py 8.)
            unread = getattr(conn, "can_read", None) or conn.can_read_destructive
            try:
                if conn.is_connected and not await unread():
                    return conn
            except (RedisConnectionError, RedisTimeoutError, OSError):
                pass
            await _disconnect(conn)
        return None

    def done(self) -> None:
        """The acquire is over: its connection is kept idle for the next one."""
        conn, self._conn = self._conn, None
        if conn is not None and conn.is_connected:
            _idle_of(asyncio.get_running_loop()).give_back(self.client, self._where, conn)
        self._where = None

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
        waiter.done()
