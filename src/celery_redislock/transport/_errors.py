"""What the transport raises, and error replies raised the same on every Redis.

:data:`UNREACHABLE` lists the errors that mean "the lock store cannot be
reached or take writes now"; :class:`DeadlineExceeded`, :class:`ReplyLost`
and :class:`NotReplicated` are the transport's own.

Redis before 7.0 wraps the error reply of a command a script runs in one
generic error::

    ERR Error running script (call to f_<sha>): @user_script:33: @user_script: 33:
    -READONLY You can't write against a read only replica.

which redis-py can only raise as a plain ``ResponseError``.  Redis 7 passes the
inner error's code through (``READONLY You can't write ... script: ...``), and
redis-py raises ``ReadOnlyError``.  :func:`translated` gives the same class on
both, so a replica that refuses a write is "unavailable" on every server
version, not a bug in a script.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    MasterDownError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection

__all__ = [
    "UNREACHABLE",
    "DeadlineExceeded",
    "NotReplicated",
    "ReplyLost",
    "drop_demoted",
    "refused_as_too_old",
    "translated",
    "unauthenticated",
]

#: Errors that mean "the lock store could not be reached or cannot take
#: writes now", as opposed to a bad command: every ConnectionError (which
#: includes LOADING, NOAUTH, WRONGPASS and "max number of clients"), timeouts,
#: a replica answering READONLY, and a cluster that is down or resharding.
UNREACHABLE: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    ReadOnlyError,
    ClusterDownError,
    TryAgainError,
    OSError,
)


class DeadlineExceeded(TimeoutError):
    """No reply came before the caller's deadline (see :func:`~._calls.call`)."""


class ReplyLost(ConnectionError):
    """The connection broke after a command was sent, before its reply was read:
    the command may or may not have run."""


class NotReplicated(Exception):
    """A call ran, but fewer replicas than asked acknowledged it in time."""

    def __init__(self, acked: int, wanted: int, reply: Any = None) -> None:
        super().__init__(f"{acked} of {wanted} replicas acknowledged in time")
        self.acked = acked
        self.wanted = wanted
        #: What the call itself replied.
        self.reply = reply


#: The inner error of a command a script ran, as Redis 6 and earlier report it.
_WRAPPED = re.compile(
    r"Error running script \(call to f_[0-9a-f]+\): @user_script:\s*\d+:"
    r"(?: @user_script:\s*\d+:)? -(?P<inner>.*)\Z",
    re.DOTALL,
)


def _redis_py_classes() -> dict[str, Any]:
    """redis-py's own map from an error code to its exception class."""
    try:  # redis-py >= 5: the parsers' base class holds it
        from redis._parsers.base import BaseParser
    except ImportError:  # pragma: no cover - a layout this was not tested on
        return {}
    classes = getattr(BaseParser, "EXCEPTION_CLASSES", None)
    return dict(classes) if isinstance(classes, dict) else {}


#: Error code -> exception class: redis-py's map where it can be found, over
#: the codes a script's command can be refused with.
_CLASSES: dict[str, Any] = {
    "READONLY": ReadOnlyError,
    "LOADING": BusyLoadingError,
    "MASTERDOWN": MasterDownError,
    "CLUSTERDOWN": ClusterDownError,
    "TRYAGAIN": TryAgainError,
    "OOM": OutOfMemoryError,
    "NOPERM": NoPermissionError,
    "NOSCRIPT": NoScriptError,
    **_redis_py_classes(),
}


def translated(exc: ResponseError, conn: Any = None) -> Exception:
    """``exc``, or the exception redis-py raises for the same refusal from Redis 7.

    ``conn`` is the connection the reply came on, when known: a Sentinel-managed
    connection to a master that was demoted to a replica is disconnected (so that
    the next connect asks the sentinels again) and the error becomes the
    ConnectionError redis-py's own ``read_response`` raises there.
    """
    wrapped = _WRAPPED.search(str(exc))
    if wrapped is None:
        return exc
    inner = wrapped.group("inner").strip()
    code, _, message = inner.partition(" ")
    kind = _CLASSES.get(code)
    if isinstance(kind, dict):  # (redis-py maps some codes by their message)
        kind = kind.get(message)
    if kind is None or kind is ResponseError:
        return exc
    new: Exception = kind(message)
    new.__cause__ = exc
    if isinstance(new, ReadOnlyError) and _demoted_master(conn):
        conn.disconnect()
        lost = ConnectionError("The previous master is now a slave")
        lost.__cause__ = new
        return lost
    return new


def _demoted_master(conn: Any) -> bool:
    """Whether ``conn`` is a Sentinel-managed connection meant for the master
    (one answering READONLY is talking to a demoted master)."""
    # (A connection's pool is the pool's proxy, which also says is_master.)
    pool = getattr(conn, "connection_pool", None)
    return isinstance(conn, SentinelManagedConnection) and bool(getattr(pool, "is_master", False))


def drop_demoted(client: Any) -> None:
    """After a READONLY from what a Sentinel pool took for the master, read on a
    connection already given back (a pipeline's): close the pool's idle
    connections, so that the next ones ask the sentinels again."""
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool) and pool.is_master:
        pool.disconnect(inuse_connections=False)


#: A command a script ran that Redis before 7.0 could not parse, as it words it.
_SCRIPT_SYNTAX = re.compile(
    r"Error running script \(call to f_[0-9a-f]+\): @user_script:\s*\d+: ERR syntax error\s*\Z"
)


def refused_as_too_old(exc: Exception) -> bool:
    """Whether ``exc`` is how a server before Redis 6.2 refuses the scripts'
    ``SET ... GET``: a syntax error of a command inside a script, in the words
    of Redis before 7.0 (every server since 6.2 parses the scripts' commands)."""
    return type(exc) is ResponseError and _SCRIPT_SYNTAX.search(str(exc)) is not None


def unauthenticated(exc: ResponseError) -> Optional[AuthenticationError]:
    """An AuthenticationError when ``exc`` is how Redis refuses a client that has
    not authenticated (before redis-py 5.1 no handshake comes first, and Redis
    answers a long unauthenticated command with a protocol error)."""
    if str(exc).startswith("Protocol error: unauthenticated"):
        return AuthenticationError(str(exc))
    return None
