"""A task's release, sent in the transaction that stores its result.

After a successful body the tracer stores the result (celery/app/trace.py:
``mark_as_done``; for the Redis result backend that is a GET, to keep an
earlier SUCCESS, then MULTI, SETEX, PUBLISH, EXEC through a redis-py
pipeline: two round trips).  When that backend is on the lock store's
server, LockedTask leaves its release to that store, which becomes one
transaction: MULTI, the release script, the ``result_store`` script (the
same check, SET and PUBLISH, in one step), EXEC.

- the lock frees in the instant the result appears: whoever sees the result
  never finds the lock still held;
- the release costs no round trip of its own, and the store one fewer;
- the transaction is written and read by hand (:mod:`wire`, :mod:`resp`),
  which costs the worker far less than redis-py's read and pipeline.

Only where nothing else can tell the difference: a backend of exactly
celery's ``RedisBackend`` class (a subclass may store differently) with the
JSON result serializer (the script reads a stored status), on the lock
client's host and port (or socket) with the same credentials, both
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
read and ``set``, with its retries.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Optional

from redis.exceptions import NoScriptError

from . import checkout, config, resp, scripts, wire

__all__ = ["flush", "offer"]

_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"
_STORE = scripts.get("result_store")
#: EVALSHA result_store 1, up to the key.
_STORE_HEAD = b"*6\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n" % _STORE.sha.encode()
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
        #: MULTI [SELECT lock db] <release> [SELECT result db] <result_store> EXEC
        self.before = _MULTI + (_select(lock_db) if switch else b"")
        self.after = _select(result_db) if switch else b""
        queued = 4 if switch else 2
        self.replies = queued + 2  # MULTI's, each QUEUED, and EXEC's
        self.release_at = 1 if switch else 0  # in EXEC's reply
        self.store_at = 3 if switch else 1


class Pending:
    """A run whose release waits for the store of its result."""

    __slots__ = ("hold", "key", "plan", "read", "task_id")

    def __init__(self, key: bytes, task_id: str, hold: Any, plan: Plan) -> None:
        self.key = key
        self.task_id = task_id
        self.hold = hold
        self.plan = plan
        #: Whether Celery's read of the stored result was answered here (with
        #: "nothing stored"), leaving its check for a SUCCESS to the store.
        self.read = False


class _Local(threading.local):
    pending: Optional[Pending] = None


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
    _local.pending = Pending(backend.get_key_for_task(request.id), request.id, hold, plan)
    return True


def flush() -> None:
    """Release a hold still waiting for its result's store (the store did not come)."""
    pending = _local.pending
    if pending is not None:
        _local.pending = None
        pending.hold.release()


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
    if any(mine.get(k) != theirs.get(k) for k in _SAME_SERVER) or backend.serializer != "json":
        return None  # (the store script reads a stored result's status as JSON)
    backend.client.script_load(_STORE.script)
    return Plan(pool, int(mine.get("db") or 0), int(theirs.get("db") or 0))


def _install(backend: Any) -> None:
    """Give this backend instance a ``get`` and a ``set`` that serve a pending
    run's store, and a ``process_cleanup`` that flushes a run left pending."""
    celery_get = backend.get
    celery_set = backend.set
    celery_cleanup = backend.process_cleanup

    def get(key: Any) -> Any:
        pending = _local.pending
        if pending is not None and pending.key == key:
            # Celery reads the stored result only to keep an earlier SUCCESS
            # (a redelivered run that already succeeded); the store checks.
            pending.read = True
            return None
        return celery_get(key)

    def set(key: Any, value: Any, expires: Any = None, **retry_policy: Any) -> Any:
        pending = _local.pending
        if pending is None or pending.key != key:
            return celery_set(key, value, expires, **retry_policy)
        _local.pending = None
        if _store(backend, pending, key, value, expires):
            return None
        if pending.read and backend._get_task_meta_for(pending.task_id)["status"] == "SUCCESS":
            return None  # the check Celery's own read would have made
        return celery_set(key, value, expires, **retry_policy)

    def process_cleanup() -> Any:
        flush()
        return celery_cleanup()

    backend.get = get
    backend.set = set
    backend.process_cleanup = process_cleanup


def _store(backend: Any, pending: Pending, key: bytes, value: Any, expires: Any) -> bool:
    """Release and store the result in one transaction; False: the store is
    left to Celery's ``set`` (the release is done either way)."""
    hold, plan = pending.hold, pending.plan
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
    store = _STORE_HEAD + wire.pack_arg(key) + wire.pack_arg(value) + wire.pack_arg(expires or 0)
    packed = plan.before + release + plan.after + store + _EXEC
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
    if isinstance(stored, NoScriptError):  # flushed since: load it for next time
        backend.client.script_load(_STORE.script)
        return False
    if isinstance(stored, Exception):
        raise stored  # as redis-py's pipeline raises an error reply
    return True


def _select(db: int) -> bytes:
    return b"*2\r\n$6\r\nSELECT\r\n" + wire.pack_arg(db)
