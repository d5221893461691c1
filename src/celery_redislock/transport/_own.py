"""Connections of the library's own, made like the pool's but kept outside it.

A blocked wait holds its connection for as long as it waits; taken from the
client's pool it would starve a bounded pool (``BlockingConnectionPool``,
``max_connections``), where waiters would hold every connection while the
holders they wait for could not renew or release.  Calls bounded by a
caller's deadline (``acquire(timeout=...)``) need a connection whose every
step is bounded too.  Both use connections made by the pool's own connection
class from the pool's own settings (TLS, auth, a Sentinel connection still
asks the sentinels where the master is), with two changes:

- no retries: a deadline-bounded caller retries in its own loop, only while
  time is left (redis-py's retry policy would reconnect with backoff, for as
  long as it is configured to);
- connect and socket timeouts of :data:`CONNECT_TIMEOUT` where the pool has
  none, so that connecting (TCP, then the handshake) is bounded.

They are kept, idle, for the next use, one per wait or call in progress, and
closed when the client's pool goes away: their sockets first, before the
garbage collector finalizes anything of the pool's (redis-py's connections
sit in reference cycles with their pool, and a socket finalized before its
connection would be closed with an "unclosed socket" ResourceWarning).  A
wait reads its reply from a blocking socket (:func:`read_until`);
:func:`take` gives the next user the connection's own socket timeout back.
Callers ``connect()`` one before each use, as a pool does on checkout:
since redis-py 6 a send on a closed connection reconnects to the host it
last had, skipping a Sentinel connection's discovery of the current master.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
import threading
import time
import weakref
from typing import Any, Optional

from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "CONNECT_TIMEOUT",
    "connect",
    "connect_timeout",
    "give_back",
    "plain_socket",
    "read_until",
    "take",
]

#: Connect and socket timeout of an own connection when the pool sets none, s.
CONNECT_TIMEOUT = 1.0

#: The attribute of a pool that holds its idle own connections.  They live on
#: the pool, not in a table of this module, so they go when it goes: a
#: connection's settings can refer back to the client that owns the pool
#: (redis-py's maintenance-notification handler does), and a process-wide
#: table of them would keep that client alive for ever.
_IDLE = "_celery_redislock_idle_waits"
_idle_lock = threading.Lock()


def connect_timeout(client: Any) -> float:
    """How long connecting an own connection of ``client``'s pool may take, s."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    return float(kwargs.get("socket_connect_timeout") or CONNECT_TIMEOUT)


class _Idle:
    """The idle own connections of one pool in one process, and their sockets
    (closed by a finalizer of the pool, which holds the sockets, not the pool)."""

    __slots__ = ("conns", "pid", "socks")

    def __init__(self, pool: Any) -> None:
        self.pid = os.getpid()
        self.conns: list[Any] = []
        self.socks: list[Any] = []
        with contextlib.suppress(TypeError):  # (a pool that takes no weak reference)
            weakref.finalize(pool, _close, self.socks).atexit = False

    def pop(self) -> Any:
        conn = self.conns.pop()
        sock = getattr(conn, "_sock", None)
        self.socks[:] = [s for s in self.socks if s is not sock and s.fileno() != -1]
        return conn

    def push(self, conn: Any) -> None:
        self.conns.append(conn)
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            self.socks.append(sock)


def _close(socks: list[Any]) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()


def _idle(pool: Any) -> Optional[_Idle]:
    """``pool``'s idle own connections in this process (not a parent's sockets)."""
    idle = getattr(pool, _IDLE, None)
    return idle if idle is not None and idle.pid == os.getpid() else None


def take(pool: Any) -> Any:
    """An idle own connection of ``pool``, or a new one (not connected yet)."""
    with _idle_lock:
        idle = _idle(pool)
        conn = idle.pop() if idle is not None and idle.conns else None
    if conn is not None:
        _own_timeout(conn)
        return conn
    kwargs = dict(pool.connection_kwargs)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["socket_connect_timeout"] = kwargs.get("socket_connect_timeout") or CONNECT_TIMEOUT
    kwargs["socket_timeout"] = kwargs.get("socket_timeout") or CONNECT_TIMEOUT
    return pool.connection_class(**kwargs)


def connect(conn: Any, by: Optional[float] = None) -> None:
    """``conn.connect()`` (nothing when connected), as a pool does on checkout.

    With ``by`` (time.monotonic()), connecting a new connection, handshake
    included, takes no longer than until then: its connect and socket
    timeouts are cut to the time left for that, and put back once connected.
    """
    if by is None or getattr(conn, "_sock", True) is not None:
        conn.connect()
        return
    timeouts = conn.socket_connect_timeout, conn.socket_timeout
    left = max(0.001, by - time.monotonic())
    conn.socket_connect_timeout = min(timeouts[0] or left, left)
    conn.socket_timeout = min(timeouts[1] or left, left)
    try:
        conn.connect()
    finally:
        conn.socket_connect_timeout, conn.socket_timeout = timeouts
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            sock.settimeout(timeouts[1])


def read_until(conn: Any, by: float) -> None:
    """Let the next reads on ``conn`` wait for a reply until ``by`` (time.monotonic()).

    On a plain socket on Linux the socket blocks, with a receive timeout in
    the kernel (SO_RCVTIMEO): a reply wakes the read itself, with no poll()
    before it and no Python between the two, which is most of what a
    hand-over costs the woken waiter.  A read that times out raises redis-py's
    ConnectionError (EAGAIN) at ``by``.  Elsewhere (TLS, a socket of gevent or
    eventlet, whose reads a kernel timeout would not end) the socket's own
    timeout is cut to the time left, and a late read raises TimeoutError.
    """
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return
    left = max(0.001, by - time.monotonic())
    if _kernel_timed(sock):
        sock.settimeout(None)
        _receive_timeout(sock, max(1, int(left * 1e6)))
    else:
        sock.settimeout(left)
    conn._celery_redislock_read_until = True


#: SO_RCVTIMEO takes a struct timeval of two C longs on Linux.
_KERNEL_TIMEOUT = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVTIMEO")
#: The standard library's socket class (None when monkey-patched already:
#: gevent's and eventlet's sockets never block in the kernel).  Its exact
#: type, so that a TLS socket, a subclass, is not taken for one.
_PLAIN_SOCKET = socket.socket if socket.socket.__module__ == "socket" else None


def plain_socket(sock: Any) -> bool:
    """Whether ``sock`` is the standard library's own socket (not TLS, not gevent's)."""
    return _PLAIN_SOCKET is not None and type(sock) is _PLAIN_SOCKET


def _kernel_timed(sock: Any) -> bool:
    return _KERNEL_TIMEOUT and plain_socket(sock)


def _receive_timeout(sock: Any, us: int) -> None:
    """SO_RCVTIMEO of ``sock``, in µs (0: none)."""
    sock.setsockopt(
        socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", *divmod(us, 1_000_000))
    )


def _own_timeout(conn: Any) -> None:
    """Undo :func:`read_until`: the connection's own socket timeout, no kernel one."""
    if not getattr(conn, "_celery_redislock_read_until", False):
        return
    conn._celery_redislock_read_until = False
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        sock.settimeout(conn.socket_timeout)
        if _kernel_timed(sock):
            _receive_timeout(sock, 0)


def give_back(pool: Any, conn: Any) -> None:
    """Keep ``conn`` for the next use (a disconnected one reconnects then)."""
    with _idle_lock:
        idle = _idle(pool)
        if idle is None:
            idle = _Idle(pool)
            setattr(pool, _IDLE, idle)
        idle.push(conn)


def _reset_after_fork() -> None:
    global _idle_lock
    _idle_lock = threading.Lock()  # it may have been held by a thread of the parent


os.register_at_fork(after_in_child=_reset_after_fork)
