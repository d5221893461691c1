"""The hot path to Redis: script calls and wake-up pops, packed and sent by hand.

On a local Redis, redis-py's generic command path costs more client time
than the round trip itself (encoding every argument anew, command-name
parsing, observability hooks, response callbacks): measured here, an
EVALSHA with a lock's six keys took ~50 µs more through ``Script.__call__``
than the same bytes sent by hand, and ~90 µs more on a cold CPU, which is
the usual state of a worker that just woke up.  A primitive's keys never
change, so they are encoded once (:class:`KeyBlock`), and each call encodes
only its few arguments.

Each thread keeps one connection of each pool it uses checked out
(:mod:`checkout`).  Nothing can be left unread on it by accident: an error
or an interruption (a soft time limit, say) between sending and reading
disconnects it, as redis-py does inside its own reads.  A reply can be left
to read later on purpose (:func:`send_soon`); it is then read before
anything else is sent on that connection.  A ``BlockingConnectionPool`` has
a hard size, so it is borrowed from and given back on every call instead.

Plain TCP, TLS and unix-socket connections are written and read here
directly (:mod:`resp`); other connection classes (Sentinel's, client-side
caching's) may act on replies, so they keep redis-py's reader.

Connections are made by the client's own connection class; a call that
finds its connection broken goes again on a fresh one under the client's
retry policy, and NOSCRIPT is answered by loading the script and sending
again, as redis-py does.  A client this does
not know how to drive (Redis Cluster, a single-connection client, anything
without a connection pool, an encoding other than UTF-8) takes redis-py's
normal path instead.
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Optional

from redis.commands.core import Script
from redis.connection import (
    BlockingConnectionPool,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

from . import resp
from .checkout import borrow, checkout, settle_thread
from .checkout import settle as checkout_settle

__all__ = [
    "KeyBlock",
    "blpop",
    "evalsha",
    "pack_arg",
    "pack_evalsha",
    "raw_pool",
    "send_soon",
    "settle",
]

#: Connection classes whose I/O is the socket itself, read and written here
#: directly (:func:`_raw_send_and_read`).  Subclasses (Sentinel's, client-side
#: caching's) may act on replies, so they keep redis-py's reader.
_RAW_CLASSES = frozenset({Connection, SSLConnection, UnixDomainSocketConnection})
#: redis-py >= 7 connections can be asked to reconnect (server maintenance).
_RECONNECT_HINTS = hasattr(Connection, "should_reconnect")


class KeyBlock:
    """The keys of one primitive, kept both as a list and packed for EVALSHA."""

    __slots__ = ("heads", "keys", "packed")

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        count = str(len(keys)).encode()
        self.packed = b"$%d\r\n%s\r\n" % (len(count), count) + b"".join(
            [b"$%d\r\n%s\r\n" % (len(k), k) for k in [key.encode("utf-8") for key in keys]]
        )
        #: (script sha, number of args) -> the command up to its first argument.
        self.heads: dict[tuple[str, int], bytes] = {}

    def head(self, sha: str, nargs: int) -> bytes:
        head = self.heads.get((sha, nargs))
        if head is None:
            n = 3 + len(self.keys) + nargs
            head = self.heads[sha, nargs] = (
                b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % (n, sha.encode()) + self.packed
            )
        return head


def evalsha(client: Any, script: Script, block: KeyBlock, args: list[Any]) -> Any:
    """Run ``script`` on ``block.keys`` with ``args``: one round trip when it is loaded."""
    pool = _pool_of(client)
    if pool is None:
        return script(keys=block.keys, args=args, client=client)
    packed = pack_evalsha(script, block, args)
    try:
        return _roundtrip(pool, packed)
    except NoScriptError:
        # Redis restarted or was flushed since the script was last loaded.
        client.script_load(script.script)
        return _roundtrip(pool, packed)


def pack_evalsha(script: Script, block: KeyBlock, args: list[Any]) -> bytes:
    """``script`` on ``block.keys`` with ``args``, as the bytes sent to Redis."""
    return block.head(script.sha, len(args)) + b"".join([pack_arg(a) for a in args])


def send_soon(client: Any, packed: bytes, on_reply: Callable[[Any], None]) -> bool:
    """Send the command ``packed`` now and leave its reply to be read later, into ``on_reply``.

    The reply is read before this thread next sends anything on the same
    connection, or at :func:`settle`; ``on_reply`` gets it (an error reply as
    an exception instance), or :class:`checkout.ReplyLost`.  Returns False,
    having sent nothing, for a client or connection this cannot do that on
    (the caller then makes an ordinary call).
    """
    pool = _pool_of(client)
    if pool is None or _is_blocking(pool):
        return False
    held: Any = checkout(pool)
    if held.pending:
        held.drain()  # one command in flight at a time: resp reads one reply per recv
    conn = held.conn
    sock = conn._sock
    if type(conn) not in _RAW_CLASSES or sock is None:
        return False
    try:
        sock.sendall(packed)
    except OSError:
        held.fail(ConnectionError("the connection broke"))  # also fails replies deferred before
        return False
    except BaseException as exc:
        held.fail(exc)  # interrupted mid-send: the connection is unusable
        raise
    held.defer(on_reply)
    return True


def raw_pool(client: Any) -> Any:
    """The connection pool of ``client`` when this module writes and reads its
    connections itself (plain TCP, TLS or unix socket; not a blocking pool),
    else None."""
    pool = _pool_of(client)
    if pool is None or _is_blocking(pool) or pool.connection_class not in _RAW_CLASSES:
        return None
    return pool


def settle(client: Any = None) -> None:
    """Read this thread's deferred replies on ``client`` now (see :func:`send_soon`);
    on every client when None."""
    if client is None:
        settle_thread()
        return
    pool = _pool_of(client)
    if pool is not None:
        checkout_settle(pool)


def blpop(client: Any, key: str, timeout: float) -> Optional[tuple[Any, Any]]:
    """BLPOP ``key`` for at most ``timeout`` seconds; None when it timed out."""
    pool = _pool_of(client)
    if pool is None:
        return client.blpop([key], timeout=timeout)  # type: ignore[no-any-return]
    reply = _roundtrip(
        pool, b"*3\r\n$5\r\nBLPOP\r\n" + pack_arg(key) + pack_arg(repr(float(timeout)))
    )
    return None if reply is None else (reply[0], reply[1])


def pack_arg(value: Any) -> bytes:
    """One bulk string of the RESP protocol (the client's encoding is UTF-8)."""
    kind = type(value)
    if kind is str:
        data = value.encode("utf-8")
    elif kind is int:
        data = b"%d" % value
    elif isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = str(value).encode("utf-8")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        data = repr(value).encode()
    else:
        raise TypeError(f"cannot send {value!r} to Redis")
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _is_blocking(pool: Any) -> bool:
    """Whether ``pool`` is a BlockingConnectionPool (by type, once: isinstance on
    redis-py's pool classes goes through abc)."""
    kind = type(pool)
    known = _BLOCKING.get(kind)
    if known is None:
        blocking: Any = BlockingConnectionPool  # untyped in redis-py
        known = _BLOCKING[kind] = issubclass(kind, blocking)
    return known


_BLOCKING: dict[type, bool] = {}


def _pool_of(client: Any) -> Any:
    """The pool to borrow a connection from, or None: use redis-py's own path."""
    if getattr(client, "connection", True) is not None:
        return None  # single-connection client, or no redis.Redis at all
    pool = getattr(client, "connection_pool", None)
    if pool is None or pool.connection_kwargs.get("encoding", "utf-8") != "utf-8":
        return None
    return pool


def _roundtrip(pool: Any, packed: bytes) -> Any:
    if _is_blocking(pool):
        conn = borrow(pool)
        try:
            return _send_and_read(conn, packed)
        finally:
            pool.release(conn)
    held: Any = checkout(pool)
    if held.pending:
        held.drain()  # replies come back in order: the deferred ones first
    return _send_and_read(held.conn, packed)


def _send_and_read(conn: Any, packed: bytes) -> Any:
    if type(conn) in _RAW_CLASSES and conn._sock is not None:
        # The common case, kept free of closures and retry machinery: one
        # attempt on the open connection; anything unusual goes the long way.
        try:
            reply = _raw_send_and_read(conn, packed)
        except ResponseError:
            raise  # an error reply, read in full: the connection is fine
        except ConnectionError:
            conn.disconnect()  # closed by the server meanwhile? see below
        except BaseException:
            conn.disconnect()  # see send() below
            raise
        else:
            if _RECONNECT_HINTS and conn.should_reconnect():
                conn.disconnect()  # the server asked (maintenance); reconnect on next use
            return reply
        return _send_and_read_retrying(conn, packed, reused=False)
    return _send_and_read_retrying(conn, packed, reused=getattr(conn, "_sock", None) is not None)


def _send_and_read_retrying(conn: Any, packed: bytes, *, reused: bool) -> Any:
    raw = type(conn) in _RAW_CLASSES

    def send() -> Any:
        try:
            if raw:
                return _raw_send_and_read(conn, packed)
            conn.send_packed_command([packed])
            return conn.read_response()
        except ResponseError:
            raise  # an error reply, read in full: the connection is fine
        except BaseException:
            # Sent but not read (or an error): a reply may still be on its way,
            # and must not be taken for the reply of the next command.
            conn.disconnect()
            raise

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


def _raw_send_and_read(conn: Any, packed: bytes) -> Any:
    """Send and read on the socket itself: no parser, hooks or health check.

    Only for connection classes whose I/O is a plain (or TLS) socket
    (:data:`_RAW_CLASSES`); the caller disconnects on any exception.
    """
    sock = conn._sock
    if sock is None:
        conn.connect()
        sock = conn._sock
    try:
        sock.sendall(packed)
    except socket.timeout as exc:
        raise TimeoutError("Timeout writing to the lock store") from exc
    except OSError as exc:
        raise ConnectionError(f"Error while writing to the lock store: {exc}") from exc
    reply = resp.read_reply(sock)
    if isinstance(reply, ResponseError):
        raise reply
    return reply
