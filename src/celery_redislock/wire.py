"""The hot path to Redis: script calls and wake-up pops, packed and sent by hand.

On a local Redis, redis-py's generic command path costs more client time
than the round trip itself (encoding every argument anew, command-name
parsing, observability hooks, response callbacks): measured here, an
EVALSHA with a lock's six keys took ~50 µs more through ``Script.__call__``
than the same bytes sent by hand, and ~90 µs more on a cold CPU, which is
the usual state of a worker that just woke up.  A primitive's keys never
change, so they are encoded once (:class:`KeyBlock`), and each call encodes
only its few arguments.

Borrowing a connection from a redis-py pool and giving it back costs about
as much again (~40 µs: a lock, a poll() for stray data, metrics), so each
thread keeps one connection of each pool it uses checked out
(:func:`_connection`), given back when the thread ends or the pool is
dropped.  Nothing can be left unread on it: an error or an interruption
(a soft time limit, say) between sending and reading disconnects it, as
redis-py does inside its own reads.  A ``BlockingConnectionPool`` has a
hard size, so it is borrowed from and given back on every call instead.

The bytes still go through the client's own connection class (SSL,
Sentinel, a unix socket, ...) and retry policy, and NOSCRIPT is answered by
loading the script and sending again, as redis-py does.  A client this does
not know how to drive (Redis Cluster, a single-connection client, anything
without a connection pool, an encoding other than UTF-8) takes redis-py's
normal path instead.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import weakref
from typing import Any, Optional

from redis.commands.core import Script
from redis.connection import BlockingConnectionPool
from redis.exceptions import ConnectionError, NoScriptError, ResponseError

__all__ = ["KeyBlock", "blpop", "evalsha"]


class KeyBlock:
    """The keys of one primitive, kept both as a list and packed for EVALSHA."""

    __slots__ = ("keys", "packed")

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        encoded = [k.encode("utf-8") for k in keys]
        self.packed = _arg(str(len(keys))) + b"".join(
            b"$%d\r\n%s\r\n" % (len(k), k) for k in encoded
        )


def evalsha(client: Any, script: Script, block: KeyBlock, args: list[Any]) -> Any:
    """Run ``script`` on ``block.keys`` with ``args``: one round trip when it is loaded."""
    pool = _pool_of(client)
    if pool is None:
        return script(keys=block.keys, args=args, client=client)
    n = 3 + len(block.keys) + len(args)
    head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % (n, script.sha.encode())
    packed = head + block.packed + b"".join(_arg(a) for a in args)
    try:
        return _roundtrip(pool, packed)
    except NoScriptError:
        # Redis restarted or was flushed since the script was last loaded.
        client.script_load(script.script)
        return _roundtrip(pool, packed)


def blpop(client: Any, key: str, timeout: float) -> Optional[tuple[Any, Any]]:
    """BLPOP ``key`` for at most ``timeout`` seconds; None when it timed out."""
    pool = _pool_of(client)
    if pool is None:
        return client.blpop([key], timeout=timeout)  # type: ignore[no-any-return]
    reply = _roundtrip(pool, b"*3\r\n$5\r\nBLPOP\r\n" + _arg(key) + _arg(repr(float(timeout))))
    return None if reply is None else (reply[0], reply[1])


def _arg(value: Any) -> bytes:
    """One bulk string of the RESP protocol (the client's encoding is UTF-8)."""
    if isinstance(value, str):
        data = value.encode("utf-8")
    elif isinstance(value, bytes):
        data = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        data = repr(value).encode()
    else:
        raise TypeError(f"cannot send {value!r} to Redis")
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _pool_of(client: Any) -> Any:
    """The pool to borrow a connection from, or None: use redis-py's own path."""
    if getattr(client, "connection", True) is not None:
        return None  # single-connection client, or no redis.Redis at all
    pool = getattr(client, "connection_pool", None)
    if pool is None or pool.connection_kwargs.get("encoding", "utf-8") != "utf-8":
        return None
    return pool


def _roundtrip(pool: Any, packed: bytes) -> Any:
    blocking: Any = BlockingConnectionPool  # untyped in redis-py
    if isinstance(pool, blocking):
        conn = _borrow(pool)
        try:
            return _send_and_read(conn, packed)
        finally:
            pool.release(conn)
    return _send_and_read(_connection(pool), packed)


def _send_and_read(conn: Any, packed: bytes) -> Any:
    def send() -> Any:
        try:
            conn.send_packed_command([packed])
            return conn.read_response()
        except ResponseError:
            raise  # an error reply, read in full: the connection is fine
        except BaseException:
            # Sent but not read (or an error): a reply may still be on its way,
            # and must not be taken for the reply of the next command.
            conn.disconnect()
            raise

    reused = getattr(conn, "_sock", None) is not None
    try:
        try:
            return conn.retry.call_with_retry(send, lambda error: conn.disconnect())
        except ConnectionError:
            if not reused:
                raise
            # A connection kept open between calls may have been closed by the
            # server meanwhile (a restart, an idle timeout): the pool would
            # have noticed on checkout; here the first use does.  Once more on
            # a fresh connection.
            return conn.retry.call_with_retry(send, lambda error: conn.disconnect())
    finally:
        should_reconnect = getattr(conn, "should_reconnect", None)
        if should_reconnect is not None and should_reconnect():
            conn.disconnect()  # the server asked (maintenance); reconnect on next use


def _borrow(pool: Any) -> Any:
    pool_class: Any = type(pool)
    if _wants_command_name(pool_class):
        return pool.get_connection("EVALSHA")  # redis-py before 5.3
    return pool.get_connection()


@functools.cache
def _wants_command_name(pool_class: Any) -> bool:
    parameters = inspect.signature(pool_class.get_connection).parameters
    name = parameters.get("command_name")
    return name is not None and name.default is inspect.Parameter.empty


class _Checkout:
    """A connection one thread keeps out of a pool; given back when dropped."""

    __slots__ = ("conn", "pid", "pool")

    def __init__(self, pool: Any) -> None:
        self.pool = weakref.ref(pool)
        self.pid = os.getpid()
        self.conn = _borrow(pool)

    def __del__(self) -> None:
        if self.pid != os.getpid():
            return  # the parent's connection, in a forked child: not ours to touch
        pool = self.pool()
        try:
            if pool is not None:
                pool.release(self.conn)
            else:
                self.conn.disconnect()
        except Exception:  # interpreter shutdown, a closed pool: nothing to do
            pass


class _Local(threading.local):
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.checkouts: weakref.WeakKeyDictionary[Any, _Checkout] = weakref.WeakKeyDictionary()


_local = _Local()


def _connection(pool: Any) -> Any:
    """This thread's connection of ``pool`` (see the module docstring)."""
    local = _local
    if local.pid != os.getpid():  # forked: the parent's sockets are not ours
        local.pid = os.getpid()
        local.checkouts = weakref.WeakKeyDictionary()
    checkout = local.checkouts.get(pool)
    if checkout is None:
        checkout = local.checkouts[pool] = _Checkout(pool)
    return checkout.conn
