"""Per-thread connections for the hot path, and replies read later.

Borrowing a connection from a redis-py pool and giving it back costs about
as much as a local round trip (~40 µs: a lock, a poll() for stray data,
metrics), so each thread keeps one connection of each pool it uses checked
out (:func:`checkout`), given back when the thread ends or the pool is
dropped.  A forked child never touches its parent's.

A command may be sent now and its reply read later (:meth:`Checkout.defer`):
a task's release is sent as the body ends, and its reply is read once the
result is stored (by then it has arrived, so reading it does not block).
Replies are always read in the order the commands were sent: before this
thread sends anything else on the connection, or when :func:`settle` is
called.  Whoever deferred a reply gets it through a callback, or gets
:class:`ReplyLost` if the connection broke first (the command may or may
not have run).
"""

from __future__ import annotations

import collections
import functools
import inspect
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Optional

from redis.exceptions import ConnectionError, TimeoutError

from . import resp

__all__ = ["Checkout", "ReplyLost", "borrow", "checkout", "settle", "settle_thread"]

#: Receives a deferred command's reply (an error reply as an exception
#: instance), or :class:`ReplyLost`.
OnReply = Callable[[Any], None]


class ReplyLost(ConnectionError):
    """The connection broke after a deferred command was sent, before its reply was read."""


class Checkout:
    """A connection one thread keeps out of a pool; given back when dropped."""

    __slots__ = ("__weakref__", "conn", "listed", "pending", "pid", "pool")

    def __init__(self, pool: Any) -> None:
        self.pool = weakref.ref(pool)
        self.pid = os.getpid()
        self.conn = borrow(pool)
        self.pending: collections.deque[OnReply] = collections.deque()
        #: Whether this thread's list of unsettled checkouts holds this one.
        self.listed = False

    def defer(self, on_reply: OnReply) -> None:
        """The command just sent on ``conn`` gets its reply read later, into ``on_reply``."""
        if not self.listed:
            self.listed = True
            _local.unsettled.append(self)
        self.pending.append(on_reply)

    def drain(self) -> None:
        """Read every deferred reply, oldest first, and hand each to its callback."""
        pending = self.pending
        while pending:
            on_reply = pending.popleft()
            try:
                sock = self.conn._sock
                if sock is None:
                    raise ConnectionError("the connection closed before the reply was read")
                reply = resp.read_reply(sock)
            except BaseException as exc:
                self.fail(exc, on_reply)
                if not isinstance(exc, (ConnectionError, TimeoutError)):
                    raise  # an interruption (a soft time limit, ...): let it through
                return
            on_reply(reply)

    def fail(self, exc: BaseException, *first: OnReply) -> None:
        """The connection broke: disconnect, and tell everyone still waiting for a reply."""
        self.conn.disconnect()
        lost = [*first, *self.pending]
        self.pending.clear()
        for on_reply in lost:
            on_reply(ReplyLost(f"reply lost: {exc!r}"))

    def __del__(self) -> None:
        if self.pid != os.getpid():
            return  # the parent's connection, in a forked child: not ours to touch
        pool = self.pool()
        try:
            if self.pending or pool is None:
                self.conn.disconnect()  # never hand on a connection with replies unread
            if pool is not None:
                pool.release(self.conn)
        except Exception:  # interpreter shutdown, a closed pool: nothing to do
            pass


def _dead() -> None:
    return None


class _Local(threading.local):
    def __init__(self) -> None:
        self.checkouts: weakref.WeakKeyDictionary[Any, Checkout] = weakref.WeakKeyDictionary()
        #: Checkouts that may have replies to read (see settle_thread).
        self.unsettled: list[Checkout] = []
        #: The pool asked for last and its checkout, both weakly (nearly every
        #: call asks for the same one; WeakKeyDictionary.get makes a weakref).
        self.last: tuple[Any, Any] = (_dead, _dead)


_local = _Local()


def _forget_after_fork() -> None:
    # The parent's sockets are not the child's.  (A fork hook rather than a
    # pid check per call: os.getpid() is a system call.)
    global _local
    _local = _Local()


os.register_at_fork(after_in_child=_forget_after_fork)


def checkout(pool: Any, create: bool = True) -> Optional[Checkout]:
    """This thread's connection of ``pool``: created on first use unless ``create`` is False."""
    local = _local
    last_pool, last = local.last
    if last_pool() is pool:
        held: Optional[Checkout] = last()
        if held is not None:
            return held
    held = local.checkouts.get(pool)
    if held is None:
        if not create:
            return None
        held = local.checkouts[pool] = Checkout(pool)
    local.last = (weakref.ref(pool), weakref.ref(held))
    return held


def settle(pool: Any) -> None:
    """Read this thread's deferred replies on ``pool`` now (their callbacks run here)."""
    held = checkout(pool, create=False)
    if held is not None and held.pending:
        held.drain()


def settle_thread() -> None:
    """Read every deferred reply of this thread, on any pool."""
    unsettled = _local.unsettled
    while unsettled:
        held = unsettled.pop()
        held.listed = False
        if held.pending:
            held.drain()


def borrow(pool: Any) -> Any:
    """One connection from ``pool``, asked for the way its redis-py version wants."""
    pool_class: Any = type(pool)
    if _wants_command_name(pool_class):
        return pool.get_connection("EVALSHA")  # redis-py before 5.3
    return pool.get_connection()


@functools.cache
def _wants_command_name(pool_class: Any) -> bool:
    parameters = inspect.signature(pool_class.get_connection).parameters
    name = parameters.get("command_name")
    return name is not None and name.default is inspect.Parameter.empty
