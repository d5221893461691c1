"""Which pool a call borrows from, taking a connection from it, and giving it back.

:func:`pool_of` finds the pool of a ``redis.Redis`` that sends commands the
way ``redis.Redis`` does, through a pool (not a single-connection client,
nor a client-side caching pool); any other client's calls go through its
``execute_command`` (:mod:`._execute`).

For a plain ``redis.ConnectionPool``, ``get_connection()`` checks the pool
was not inherited through ``fork``, pops an idle connection under the pool's
lock, connects it if it is not, checks that it has nothing to read (a
connection the server closed, or one left out of step, is reconnected), and
since redis-py 7 updates two connection-count metrics.  In a tight loop
that is a few µs; in code that has just woken up (a release after a hold,
the common case) it measured 100-190 µs, as much as the rest of the release
up to its send, most of it in the check (a socket timeout set, a read that
fails, the timeout set back) and the metrics.

:func:`checkout` takes the same steps for such a pool, with two changes:
redis-py's check runs only once one ``poll()`` of a plain socket has found
something to read, or a close (always, for any other socket: TLS, gevent's
or eventlet's), and the metric updates of the checkout are made when the
connection is given back, just before the pool makes its own, so the counts
stay balanced and nothing is recorded before the send.

This reads the pool's private attributes, so it is switched on only where it
does what ``get_connection()`` does: for a pool of exactly that class (not a
subclass such as ``BlockingConnectionPool`` or Sentinel's, whose checkout
differs), whose ``get_connection()`` refers to nothing but the steps above
(checked once, against its code) and whose attributes are what they are in
redis-py 5 to 8.  Anything else, or a pool with no idle connection, goes
through ``get_connection()`` (with the command name redis-py before 5.3
asks for).
"""

from __future__ import annotations

import functools
import inspect
import os
import select
from typing import Any, Callable, Optional

import redis
import redis.connection
from redis.exceptions import ConnectionError, TimeoutError

from . import _own

__all__ = ["checkin", "checkout", "pool_of"]

#: Everything a mirrored ``get_connection()`` may refer to (redis-py 5.0 to 8.1).
_STEPS = frozenset(
    {
        "BaseException",
        "ConnectionError",
        "ConnectionState",
        "IDLE",
        "IndexError",
        "OSError",
        "TimeoutError",
        "USED",
        "_available_connections",
        "_checkpid",
        "_in_use_connections",
        "_lock",
        "add",
        "cache",
        "can_read",
        "connect",
        "disconnect",
        "get_pool_name",
        "maint_notifications_enabled",
        "make_connection",
        "monotonic",
        "pop",
        "record_connection_count",
        "record_connection_create_time",
        "release",
        "time",
    }
)

#: Whether :func:`checkout` takes the mirrored steps (read per call:
#: bench/transport_paths.py turns it off to compare).
MIRRORED = True

#: Set on a connection taken by the mirrored checkout: its metrics are owed.
_OWED = "_celery_redislock_checkout_owed"
#: A connection's (socket, poll object) for the check.
_POLL = "_celery_redislock_poll"


def pool_of(client: Any) -> Any:
    """The pool a call borrows a connection from, or None: a client whose
    commands go through its ``execute_command`` (see :mod:`._execute`)."""
    if type(client) is redis.Redis or (isinstance(client, redis.Redis) and _plain(type(client))):
        pool = client.connection_pool
        # Not a single-connection client, nor a client-side caching pool (whose
        # connections answer some reads from the cache: only its own commands
        # keep that bookkeeping straight).
        if client.connection is None and getattr(pool, "cache", None) is None:
            return pool
    return None


@functools.cache
def _plain(kind: Any) -> bool:
    """Whether a redis.Redis subclass sends commands the way redis.Redis does."""
    return all(
        getattr(kind, name) is getattr(redis.Redis, name)
        for name in ("execute_command", "_execute_command", "parse_response")
        if hasattr(redis.Redis, name)
    )


@functools.cache
def mirrored() -> bool:
    """Whether this redis-py's ``ConnectionPool.get_connection()`` is one
    whose every step :func:`checkout` takes."""
    try:
        code = inspect.unwrap(redis.ConnectionPool.get_connection).__code__
        pool = redis.ConnectionPool()
        shaped = (
            isinstance(pool._available_connections, list)
            and isinstance(pool._in_use_connections, set)
            and hasattr(pool._lock, "__enter__")
            and pool.pid == os.getpid()
        )
    except Exception:  # (any surprise: the public path)
        return False
    return shaped and set(code.co_names) <= _STEPS and hasattr(select, "poll")


def checkout(pool: Any) -> Any:
    """A connection of ``pool`` for one call, ready to send on."""
    # Buys a hand-over median of 0.88-0.89x on redis-py 8.1 (bench/transport_paths.py,
    # three runs of 15 interleaved batches); 0.95-0.96x on redis-py 5.0, whose
    # checkout records no metrics.
    if MIRRORED and type(pool) is redis.ConnectionPool and pool.pid == os.getpid() and mirrored():
        with pool._lock:
            idle = pool._available_connections
            conn = idle.pop() if idle else None
            if conn is not None:
                pool._in_use_connections.add(conn)
        if conn is not None:
            setattr(conn, _OWED, True)
            try:
                _ready(pool, conn)
            except BaseException:
                checkin(pool, conn)
                raise
            return conn
    if _wants_command_name(pool.__class__):
        return pool.get_connection("EVALSHA")  # redis-py before 5.3
    return pool.get_connection()


def checkin(pool: Any, conn: Any) -> None:
    """Give ``conn`` back to ``pool`` (the server may have asked for a reconnect)."""
    if getattr(conn, _OWED, False):
        setattr(conn, _OWED, False)
        _count_checkout(pool)
    should_reconnect: Optional[Callable[[], bool]] = getattr(conn, "should_reconnect", None)
    if should_reconnect is not None and should_reconnect():
        conn.disconnect()  # the server asked (maintenance): reconnect on next use
    pool.release(conn)


def _ready(pool: Any, conn: Any) -> None:
    """Connect ``conn`` if it is not, and reconnect it if it has anything to
    read, as ``get_connection()`` does (redis-py's own check, only once a
    poll() has found something on the socket)."""
    if conn._sock is None:
        conn.connect()
    try:
        if _may_have_data(conn) and conn.can_read() and not _takes_pushes(pool):
            raise ConnectionError("Connection has data")
    except (ConnectionError, TimeoutError, OSError, ValueError):
        conn.disconnect()
        conn.connect()
        if conn.can_read() and not _takes_pushes(pool):
            raise ConnectionError("Connection not ready") from None


def _may_have_data(conn: Any) -> bool:
    """False when one poll() of a plain socket (kept with the connection)
    finds nothing to read and the server has not closed it; True otherwise."""
    sock = conn._sock
    if not _own.plain_socket(sock):
        return True  # (TLS may hold decrypted bytes the socket does not show)
    kept = conn.__dict__.get(_POLL)
    if kept is None or kept[0] is not sock:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        kept = (sock, poller)
        setattr(conn, _POLL, kept)
    return bool(kept[1].poll(0))


def _takes_pushes(pool: Any) -> bool:
    """Whether the pool leaves unread data on its connections (maintenance
    notifications, redis-py 7+), as ``get_connection()`` does."""
    enabled = getattr(pool, "maint_notifications_enabled", None)
    return bool(enabled is not None and enabled())


def _count_checkout(pool: Any) -> None:
    """The connection-count updates of a checkout, as ``get_connection()``
    makes them (redis-py 7+; nothing before)."""
    record = getattr(redis.connection, "record_connection_count", None)
    state = getattr(redis.connection, "ConnectionState", None)
    name_of = getattr(redis.connection, "get_pool_name", None)
    if record is None or state is None or name_of is None:
        return
    name = name_of(pool)
    record(pool_name=name, connection_state=state.IDLE, counter=-1)
    record(pool_name=name, connection_state=state.USED, counter=1)


@functools.cache
def _wants_command_name(pool_class: Any) -> bool:
    parameters = inspect.signature(pool_class.get_connection).parameters
    name = parameters.get("command_name")
    return name is not None and name.default is inspect.Parameter.empty
