"""A task's release, sent in the transaction that stores its result.

After a successful body the tracer stores the result (celery/app/trace.py:
``mark_as_done``, which for the Redis result backend ends in
``RedisBackend.set``: MULTI, SETEX, PUBLISH, EXEC, through a redis-py
pipeline).  When that backend is on the lock store's server, LockedTask
leaves its release to that store, and the release script goes into the same
MULTI ... EXEC:

- the lock frees in the instant the result appears: whoever sees the result
  never finds the lock still held;
- the release costs no round trip of its own;
- the transaction is written and read by hand (:mod:`wire`, :mod:`resp`),
  which costs the worker ~100 µs less than redis-py's pipeline.

Only where nothing else can tell the difference: a backend of exactly
celery's ``RedisBackend`` class (a subclass may store differently), on the
lock client's host and port (or socket) with the same credentials, both
connections driven by :mod:`wire`; a run that stores its result (not eager,
not ``ignore_result``) and has no callbacks or chain (the tracer sends those
before it stores the result, and they may need this very lock).  Anything
else releases as the body ends.  ``redislock_release_with_result = False``
turns it off.

Exactly once: the store of this run's result takes the release; if none
comes, ``after_return`` releases, and when the tracer skips that (an
internal error), the backend's ``process_cleanup``, which the tracer calls
last for every run.  A transaction that fails before Redis ran it hands the
release back (sent again on the lock client) and the store to Celery's own
``set``, with its retries.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Optional

from . import checkout, config, resp, wire

__all__ = ["flush", "offer"]

_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"
#: Connection settings that must match for two pools to reach the same server as the same user.
_SAME_SERVER = ("host", "port", "path", "username", "password")
#: Where a backend keeps its plans: {lock client: Plan or None}.
_PLANS = "_redislock_fold"


class Plan:
    """How to fold one lock client's releases into one backend's stores."""

    __slots__ = ("after", "before", "pool", "release_at", "replies", "store_at")

    def __init__(self, pool: Any, lock_db: int, result_db: int) -> None:
        switch = lock_db != result_db
        self.pool = pool
        #: MULTI [SELECT lock db] <release> [SELECT result db] SET|SETEX PUBLISH EXEC
        self.before = _MULTI + (_select(lock_db) if switch else b"")
        self.after = _select(result_db) if switch else b""
        queued = 5 if switch else 3
        self.replies = queued + 2  # MULTI's, each QUEUED, and EXEC's
        self.release_at = 1 if switch else 0  # in EXEC's reply
        self.store_at = 3 if switch else 1


class _Local(threading.local):
    #: (result key, hold, plan) of the run whose result this thread stores next.
    pending: Optional[tuple[bytes, Any, Plan]] = None


_local = _Local()


def offer(task: Any, request: Any, hold: Any) -> bool:
    """Leave ``hold``'s release to the store of this run's result, if it can go there."""
    if _local.pending is not None:
        flush()  # never two: a store that never came
    if request.is_eager or request.callbacks or request.chain or _ignores_result(task, request):
        return False
    backend = task.backend
    client = hold.lock.client
    plans: Optional[dict[Any, Optional[Plan]]] = backend.__dict__.get(_PLANS)
    plan = plans[client] if plans is not None and client in plans else _plan(backend, client)
    if plan is None or not config.settings_for(task.app).release_with_result:
        return False
    _local.pending = (backend.get_key_for_task(request.id), hold, plan)
    return True


def flush() -> None:
    """Release a hold still waiting for its result's store (the store did not come)."""
    pending = _local.pending
    if pending is not None:
        _local.pending = None
        pending[1].release()


def _ignores_result(task: Any, request: Any) -> bool:
    actual = _actual_ignore_result()
    if actual is not None:
        return bool(actual(task, request))
    return bool(request.ignore_result or task.ignore_result)  # pragma: no cover - Celery < 5.6


@functools.cache
def _actual_ignore_result() -> Any:
    from celery.app import task as task_module

    return getattr(task_module, "get_actual_ignore_result", None)


_lock = threading.Lock()


def _plan(backend: Any, client: Any) -> Optional[Plan]:
    with _lock:  # once per backend and lock client, whichever thread comes first
        plans = backend.__dict__.setdefault(_PLANS, {})
        if client not in plans:
            plan = plans[client] = _make_plan(backend, client)
            if plan is not None and not getattr(backend, "_redislock_folds", False):
                _install(backend)
                backend._redislock_folds = True
        return plans[client]  # type: ignore[no-any-return]


def _make_plan(backend: Any, client: Any) -> Optional[Plan]:
    from celery.backends.redis import RedisBackend

    if type(backend) is not RedisBackend:
        return None
    lock_pool = wire.raw_pool(client)
    pool = wire.raw_pool(backend.client)
    if lock_pool is None or pool is None or lock_pool.connection_class is not pool.connection_class:
        return None
    mine, theirs = lock_pool.connection_kwargs, pool.connection_kwargs
    if any(mine.get(k) != theirs.get(k) for k in _SAME_SERVER):
        return None
    return Plan(pool, int(mine.get("db") or 0), int(theirs.get("db") or 0))


def _install(backend: Any) -> None:
    """Give this backend instance a ``set`` that takes a pending release, and a
    ``process_cleanup`` that flushes one left over."""
    celery_set = backend.set
    celery_cleanup = backend.process_cleanup

    def set(key: Any, value: Any, expires: Any = None, **retry_policy: Any) -> Any:
        pending = _local.pending
        if pending is not None and pending[0] == key:
            _local.pending = None
            if _store(backend, pending, key, value, expires):
                return None
        return celery_set(key, value, expires, **retry_policy)

    def process_cleanup() -> Any:
        flush()
        return celery_cleanup()

    backend.set = set
    backend.process_cleanup = process_cleanup


def _store(
    backend: Any, pending: tuple[bytes, Any, Plan], key: bytes, value: Any, expires: Any
) -> bool:
    """Store the result and release in one transaction; False: left to Celery's ``set``."""
    _, hold, plan = pending
    if expires is None:
        expires = backend.expires
    if isinstance(value, str):
        value = value.encode("utf-8")
    if (
        not isinstance(value, bytes)
        or len(value) > backend._MAX_STR_VALUE_SIZE
        or not (expires is None or type(expires) is int)
    ):
        hold.release()  # Celery's set says what is wrong with it
        return False
    parts = hold.release_packed()
    if parts is None:
        return False  # released already
    release, on_reply = parts
    body = _bulk(key) + _bulk(value)
    if expires:
        store = b"*4\r\n$5\r\nSETEX\r\n" + _bulk(key) + _bulk(b"%d" % expires) + _bulk(value)
    else:
        store = b"*3\r\n$3\r\nSET\r\n" + body
    packed = plan.before + release + plan.after + store + b"*3\r\n$7\r\nPUBLISH\r\n" + body + _EXEC
    held: Any = checkout.checkout(plan.pool)
    conn = held.conn
    try:
        if held.pending:
            held.drain()
        if conn._sock is None:
            conn.connect()
        conn._sock.sendall(packed)
        replies = resp.read_replies(conn._sock, plan.replies)
    except BaseException as exc:
        # Sent or not, run or not: the connection is out of step.  The
        # release goes again on the lock client (finding the lock gone if it
        # had run); the store, to Celery's set and its retries.
        conn.disconnect()
        on_reply(checkout.ReplyLost(f"reply lost: {exc!r}"))
        if isinstance(exc, Exception):
            return False
        raise
    done = replies[-1]
    if not isinstance(done, list):  # EXECABORT: nothing ran
        on_reply(checkout.ReplyLost(f"transaction not run: {done!r}"))
        return False
    on_reply(done[plan.release_at])
    stored = done[plan.store_at]
    if isinstance(stored, Exception):
        raise stored  # as redis-py's pipeline raises an error reply
    return True


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _select(db: int) -> bytes:
    return b"*2\r\n$6\r\nSELECT\r\n" + _bulk(b"%d" % db)
