"""Script calls through the caller's redis-py client, one round trip each.

Three kinds of client, told apart once per call by their type:

- a ``redis.Redis`` with a connection pool (plain, TLS, unix socket, Sentinel's
  ``master_for``, a ``BlockingConnectionPool``): a
  connection is taken from the pool for the call and given back after it, as
  redis-py's own commands do, so whatever the pool does on checkout
  (Sentinel's master discovery, a bounded pool's wait, a stale-data check)
  happens here too (for a plain pool, in fewer steps: :mod:`._checkout`).
  The packed command goes out through the connection's
  ``send_packed_command`` (health check, connect and authenticate on demand)
  and its reply comes back through ``read_response`` (the connection's parser
  and error mapping, RESP3 pushes), under the connection's retry policy.
- a ``redis.cluster.RedisCluster``: ``execute_command``, which routes by the
  keys' hash slot and follows MOVED and ASK; a batch goes out as one pipeline
  per node that owns some of its keys.
- anything else with ``execute_command`` (a single-connection client, a
  client-side caching pool, a subclass with its own ``execute_command``):
  ``execute_command``.

Every reply is read undecoded (``decode_responses`` does not apply): the
scripts return bytes the primitives parse, and parked task payloads may not
be text.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Sequence
from typing import Any, Callable, Optional

import redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

from . import _cluster, _encode, _own
from ._checkout import checkin as _checkin
from ._checkout import checkout as _checkout
from ._encode import KeyBlock
from ._errors import drop_demoted, translated, unauthenticated

_record: Any
try:  # redis-py >= 7: per-command metrics, when the user has turned them on
    from redis.observability.recorder import record_operation_duration as _record
except ImportError:  # pragma: no cover - older redis-py
    _record = None

__all__ = [
    "UNREACHABLE",
    "DeadlineExceeded",
    "NotReplicated",
    "Reply",
    "ReplyLost",
    "call",
    "call_batch",
    "call_soon",
    "encoding_of",
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

#: Script is a redis-py ``Script`` (or anything with ``sha`` and ``script``).
Script = Any
#: One script call: (script, keys, args).
Call = tuple[Script, KeyBlock, list[Any]]


#: How many times a deadline-bounded call is sent, at most (a reconnect each time).
_DEADLINE_TRIES = 3


class DeadlineExceeded(TimeoutError):
    """No reply came before the caller's deadline (see :func:`call`)."""


class ReplyLost(ConnectionError):
    """The connection broke after a command was sent, before its reply was read:
    the command may or may not have run."""


#: (client, weakly; its encoding) of the client asked about last: a task run
#: builds a primitive, which asks, and a worker's runs use one client.
_last_encoding: tuple[Callable[[], Any], str] = (lambda: None, "utf-8")


def encoding_of(client: Any) -> str:
    """The encoding ``client`` sends strings in (redis-py's default: UTF-8)."""
    global _last_encoding
    ref, encoding = _last_encoding
    if ref() is client and client is not None:
        return encoding
    try:
        encoding = str(client.get_encoder().encoding)
    except AttributeError:
        return "utf-8"
    try:
        ref = weakref.ref(client)
    except TypeError:  # (not weakly referable: asked again next time)
        return encoding
    _last_encoding = (ref, encoding)
    return encoding


def call(
    client: Any,
    script: Script,
    block: KeyBlock,
    args: list[Any],
    *,
    packed: Optional[bytes] = None,
    sends: Optional[list[int]] = None,
    deadline: Optional[float] = None,
    replicas: Optional[tuple[int, int]] = None,
) -> Any:
    """Run ``script`` on ``block``'s keys with ``args``: one round trip once loaded.
    ``packed``, when given, is ``block.evalsha(script.sha, args)`` made earlier.

    Error replies raise as redis-py raises them; NOSCRIPT (a restarted or
    flushed server) loads the script and sends the call again.  ``sends``,
    when given, gets one item per time the call went out after a connection
    failure could have let an earlier one run (the client's retry policy).

    ``deadline`` (time.monotonic()) bounds the call: a reply not read by then
    raises TimeoutError, and a failed try is sent again only while time is
    left, instead of under the client's retry policy.  Connecting is bounded
    by the connection's own timeouts.

    ``replicas`` ``(n, timeout_ms)``: ``WAIT n timeout_ms`` goes out right
    after the call, on the same connection and in the same round trip; the
    result is then ``(reply, replicas that acknowledged)``.
    """
    wait = None if replicas is None else _encode.command("WAIT", *replicas)
    pool = _pool_of(client)
    if pool is None and deadline is not None and isinstance(client, RedisCluster):
        return _on_node_by(client, script, block, args, sends, deadline, replicas)
    if pool is None:
        if sends is not None:
            sends.append(1)
        if wait is not None:
            return _execute_and_wait(client, script, block, args, replicas)  # type: ignore[arg-type]
        return _execute(client, script, block, args)
    if packed is None:
        packed = block.evalsha(script.sha, args)
    return _loaded_roundtrip(pool, script, packed, sends, deadline, wait, client.script_load)


def _loaded_roundtrip(
    pool: Any,
    script: Script,
    packed: Any,
    sends: Optional[list[int]],
    deadline: Optional[float],
    wait: Any,
    load: Callable[[Any], Any],
) -> Any:
    """:func:`_roundtrip`, sent again after ``load(script.script)`` when the
    server did not know the script (NOSCRIPT: a restarted or flushed server);
    the reply, or ``(reply, replicas that acknowledged)`` with ``wait``."""
    try:
        replies = _roundtrip(pool, packed, sends, deadline, wait)
    except NoScriptError:
        if sends is not None:
            sends.clear()  # an unknown script runs nothing
        load(script.script)
        replies = _roundtrip(pool, packed, sends, deadline, wait)
    return replies[0] if wait is None else (replies[0], int(replies[1]))


def _on_node_by(
    client: Any,
    script: Script,
    block: KeyBlock,
    args: list[Any],
    sends: Optional[list[int]],
    deadline: float,
    replicas: Optional[tuple[int, int]],
) -> Any:
    """:func:`call` bounded by ``deadline`` on a cluster: on a connection of
    the library's own to the node that owns the keys (``execute_command``
    would wait on a stalled node for as long as its socket timeout, and
    retry under the cluster's policy), following MOVED while time is left."""
    packed = block.evalsha(script.sha, args)
    wait = None if replicas is None else _encode.command("WAIT", *replicas)
    pool = _cluster.pool_for(client, block.keys[0])
    for _ in range(_cluster.REDIRECTS):
        load = functools.partial(_load_on, pool)
        try:
            return _loaded_roundtrip(pool, script, packed, sends, deadline, wait, load)
        except MovedError as redirect:
            pool = _cluster.follow(client, redirect)
        except AskError:
            break  # a slot in migration: through the cluster's redirects
    if replicas is not None:
        return _execute_and_wait(client, script, block, args, replicas)
    return _execute(client, script, block, args)


def _load_on(pool: Any, text: Any) -> Any:
    """SCRIPT LOAD on the server of ``pool`` (a cluster node's)."""
    return redis.Redis(connection_pool=pool).script_load(text)


def _execute_and_wait(
    client: Any, script: Script, block: KeyBlock, args: list[Any], replicas: tuple[int, int]
) -> tuple[Any, int]:
    """The call and its WAIT in one pipeline: one connection (the owning
    node's, on a cluster), so WAIT counts that call's writes."""
    target = client
    if isinstance(client, RedisCluster):
        target = client.get_redis_connection(_cluster.node_of(client, block.keys[0]))
    for attempt in (0, 1):
        pipe = target.pipeline(transaction=False)
        pipe.execute_command(*block.evalsha_args(script.sha, args), NEVER_DECODE=True)
        pipe.execute_command("WAIT", *replicas)
        reply, acked = pipe.execute(raise_on_error=False)
        if isinstance(reply, NoScriptError) and not attempt:
            target.script_load(script.script)
            continue
        if isinstance(reply, Exception):
            raise reply
        break
    return reply, int(acked)


def call_soon(
    client: Any, script: Script, block: KeyBlock, args: list[Any], packed: Optional[bytes] = None
) -> Reply:
    """Send the call now and return its :class:`Reply`, to be read later
    (``packed``: as for :func:`call`).

    The connection stays out of the pool until the reply is read.  Where a
    call cannot be split (a cluster or a single-connection client), it is
    made in full here and the Reply holds its outcome.
    """
    pool = _pool_of(client)
    if pool is None:
        try:
            return Reply.done(_execute(client, script, block, args))
        except Exception as exc:
            return Reply.done(None, exc)
    if packed is None:
        packed = block.evalsha(script.sha, args)
    conn = _checkout(pool)

    def send() -> None:
        conn.connect()  # (no-op when connected; see _roundtrip)
        _encode.send(conn, [packed])

    try:
        conn.retry.call_with_retry(send, lambda error: conn.disconnect())
    except BaseException:
        _checkin(pool, conn)
        raise
    return Reply(client, pool, conn, script, block, args)


class Reply:
    """The reply of a command sent by :func:`call_soon`; :meth:`get` reads it once."""

    __slots__ = ("_call", "_conn", "_error", "_pool", "_value", "client")

    def __init__(
        self,
        client: Any,
        pool: Any,
        conn: Any,
        script: Script = None,
        block: Optional[KeyBlock] = None,
        args: Optional[list[Any]] = None,
    ) -> None:
        self.client = client
        self._pool = pool
        self._conn = conn
        self._call = (script, block, args)
        self._value: Any = None
        self._error: Optional[BaseException] = None

    @classmethod
    def done(cls, value: Any, error: Optional[BaseException] = None) -> Reply:
        reply = cls(None, None, None)
        reply._value, reply._error = value, error
        return reply

    @property
    def pending(self) -> bool:
        return self._conn is not None

    def get(self) -> Any:
        """The reply; raises what :func:`call` would, or :class:`ReplyLost` when the
        connection broke after the command was sent."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            try:
                self._value = conn.read_response(disable_decoding=True)
            except NoScriptError:
                _checkin(self._pool, conn)
                script, block, args = self._call
                self.client.script_load(script.script)
                self._value = call(self.client, script, block, args)  # type: ignore[arg-type]
            except ResponseError as exc:
                error = translated(exc, conn)
                _checkin(self._pool, conn)
                if isinstance(error, ResponseError):
                    self._error = error
                else:  # (a demoted master: nothing ran)
                    self._error = ReplyLost(f"reply lost: {error!r}")
                    self._error.__cause__ = error
            except BaseException as exc:
                conn.disconnect()  # the reply may still come: never hand it on
                _checkin(self._pool, conn)
                if not isinstance(exc, UNREACHABLE):
                    raise  # an interruption (a soft time limit): let it through
                self._error = ReplyLost(f"reply lost: {exc!r}")
                self._error.__cause__ = exc
            else:
                _checkin(self._pool, conn)
        if self._error is not None:
            raise self._error
        return self._value

    def __del__(self) -> None:
        conn = self._conn
        if conn is not None:  # never read: the connection is out of step
            try:
                conn.disconnect()
                _checkin(self._pool, conn)
            except Exception:  # interpreter shutdown, a closed pool
                pass


class NotReplicated(Exception):
    """A call ran, but fewer replicas than asked acknowledged it in time."""

    def __init__(self, acked: int, wanted: int, reply: Any = None) -> None:
        super().__init__(f"{acked} of {wanted} replicas acknowledged in time")
        self.acked = acked
        self.wanted = wanted
        #: What the call itself replied.
        self.reply = reply


def call_batch(
    client: Any, calls: Sequence[Call], replicas: Optional[tuple[int, int]] = None
) -> list[Any]:
    """Run every call, one round trip per server; each result is the reply or
    the exception that call ended with (an error reply, or the connection's
    failure for every call that went to that server).  ``replicas`` ``(n,
    timeout_ms)`` ends each server's pipeline with ``WAIT``; a call that ran
    where fewer than ``n`` replicas acknowledged ends with NotReplicated."""
    results: list[Any] = [None] * len(calls)
    if isinstance(client, RedisCluster):
        groups: dict[Any, list[int]] = {}
        for i, (_, block, _) in enumerate(calls):
            node = _cluster.node_of(client, block.keys[0])
            groups.setdefault(node.name, []).append(i)
        for indexes in groups.values():
            node = _cluster.node_of(client, calls[indexes[0]][1].keys[0])
            _pipeline(client.get_redis_connection(node), calls, indexes, results, replicas)
        for i, result in enumerate(results):
            if isinstance(result, (MovedError, AskError, TryAgainError)):
                # Resharding: this one goes alone, through the cluster's redirects.
                results[i] = _guarded(client, calls[i], replicas)
        return results
    if _pool_of(client) is None:
        return [_guarded(client, c, replicas) for c in calls]
    _pipeline(client, calls, list(range(len(calls))), results, replicas)
    return results


def _guarded(client: Any, one: Call, replicas: Optional[tuple[int, int]] = None) -> Any:
    try:
        if replicas is None:
            return _execute(client, *one)
        reply, acked = _execute_and_wait(client, *one, replicas)
        return reply if acked >= replicas[0] else NotReplicated(acked, replicas[0], reply)
    except Exception as exc:
        return exc


def _pipeline(
    client: Any,
    calls: Sequence[Call],
    indexes: list[int],
    results: list[Any],
    replicas: Optional[tuple[int, int]] = None,
) -> None:
    """Send ``calls[i]`` for each i in ``indexes`` on ``client`` (a ``redis.Redis``)
    in one non-transactional pipeline; NOSCRIPT loads the scripts and sends
    those calls once more."""
    for attempt in (0, 1):
        pipe = client.pipeline(transaction=False)
        for i in indexes:
            script, block, args = calls[i]
            pipe.execute_command(*block.evalsha_args(script.sha, args), NEVER_DECODE=True)
        if replicas is not None:
            pipe.execute_command("WAIT", *replicas)
        try:
            replies = pipe.execute(raise_on_error=False)
        except UNREACHABLE as exc:
            for i in indexes:
                results[i] = exc
            return
        if replicas is not None:
            acked = replies.pop()
            short = not isinstance(acked, int) or acked < replicas[0]
            if short:
                count = acked if isinstance(acked, int) else 0
                replies = [
                    r if isinstance(r, Exception) else NotReplicated(count, replicas[0], r)
                    for r in replies
                ]
        for i, reply in zip(indexes, replies):
            results[i] = translated(reply) if isinstance(reply, ResponseError) else reply
        if any(isinstance(results[i], ReadOnlyError) for i in indexes):
            drop_demoted(client)
        missing = [i for i in indexes if isinstance(results[i], NoScriptError)]
        if not missing or attempt:
            return
        for script in {calls[i][0].sha: calls[i][0] for i in missing}.values():
            client.script_load(script.script)
        indexes = missing


def _execute(client: Any, script: Script, block: KeyBlock, args: list[Any]) -> Any:
    command = block.evalsha_args(script.sha, args)
    try:
        return _translating(client.execute_command, *command, NEVER_DECODE=True)
    except NoScriptError:
        if isinstance(client, RedisCluster):
            # Load it on the node that owns the keys (SCRIPT LOAD would go to one
            # node chosen by redis-py, not necessarily that one).
            node = _cluster.node_of(client, block.keys[0])
            client.get_redis_connection(node).script_load(script.script)
        else:
            client.script_load(script.script)
        return _translating(client.execute_command, *command, NEVER_DECODE=True)


def _translating(send: Callable[..., Any], *args: Any, **options: Any) -> Any:
    """``send(*args, **options)``, its error reply raised as :func:`translated` has it."""
    try:
        return send(*args, **options)
    except ResponseError as exc:
        error = translated(exc)
        if error is exc:
            raise
        raise error from exc


def _pool_of(client: Any) -> Any:
    """The pool a call borrows a connection from, or None: use execute_command."""
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


def _roundtrip(
    pool: Any,
    packed: Any,
    sends: Optional[list[int]] = None,
    deadline: Optional[float] = None,
    then: Any = None,
) -> list[Any]:
    """Send ``packed`` (and ``then`` after it, in the same write) on a
    connection of ``pool``; their replies.  An error reply to ``packed``
    raises once ``then``'s reply has been read too."""
    # A call bounded by a deadline goes on a connection of our own whose
    # connecting is bounded too, and is retried only while time is left.
    conn = _checkout(pool) if deadline is None else _own.take(pool)
    started = time.monotonic()
    commands = [packed] if then is None else [packed, then]

    def read(timed: bool) -> list[Any]:
        replies: list[Any] = []
        for _ in commands:
            if timed:
                left = deadline - time.monotonic()  # type: ignore[operator]
                if left <= 0 or not conn.can_read(timeout=left):
                    raise DeadlineExceeded("no reply before the caller's deadline")
            try:
                replies.append(conn.read_response(disable_decoding=True))
            except ResponseError as exc:
                error = translated(exc, conn)
                if not isinstance(error, ResponseError):  # (closed: nothing more to read)
                    raise error from error.__cause__
                replies.append(error)
        if isinstance(replies[0], ResponseError):
            raise replies[0]
        return replies

    tries = [0]

    def send_and_read() -> list[Any]:
        if sends is not None:
            sends.append(1)
        if tries[0]:
            # A retry, after a disconnect: connect() as the pool does, which
            # asks the sentinels where the master is now (a send would only
            # reconnect to the host it had, since redis-py 6).
            conn.connect()
        tries[0] += 1
        _encode.send(conn, commands)
        return read(False)

    def send_and_read_by_deadline() -> list[Any]:
        for tries_left in range(_DEADLINE_TRIES - 1, -1, -1):
            if sends is not None:
                sends.append(1)
            try:
                # (A no-op when connected; see send_and_read.)
                _own.connect(conn, deadline)
                _encode.send(conn, commands)
                return read(True)
            except ResponseError:
                raise
            except UNREACHABLE as exc:
                conn.disconnect()
                left = deadline - time.monotonic()  # type: ignore[operator]
                if isinstance(exc, DeadlineExceeded):
                    raise
                if left <= 0:
                    raise DeadlineExceeded(f"out of time after {exc!r}") from exc
                if not tries_left:
                    raise  # (a refused connect fails at once: do not spin)
                time.sleep(min(0.05, left))
        raise AssertionError("unreachable")  # pragma: no cover

    replies: list[Any]
    try:
        if deadline is None:
            replies = conn.retry.call_with_retry(send_and_read, lambda error: conn.disconnect())
        else:
            replies = send_and_read_by_deadline()
    except ResponseError as exc:  # an error reply: the connection is in step
        if _record is not None:
            _observe(conn, started, exc)
        refused = unauthenticated(exc)
        if refused is None:
            raise
        conn.disconnect()  # (Redis closes it too)
        raise refused from exc
    except BaseException as exc:
        # Sent but perhaps not read (an interruption, a timeout): a reply may
        # still come, and must never be taken for the next command's.
        conn.disconnect()
        if _record is not None and isinstance(exc, Exception):
            _observe(conn, started, exc)
        raise
    finally:
        if deadline is None:
            _checkin(pool, conn)
        else:
            _own.give_back(pool, conn)
    if _record is not None:
        _observe(conn, started, None)
    return replies


def _observe(conn: Any, started: float, error: Optional[Exception]) -> None:
    # (Not contextlib.suppress: its object and two calls cost more than the rest, per call.)
    try:  # noqa: SIM105
        _record(
            "EVALSHA",
            time.monotonic() - started,
            server_address=getattr(conn, "host", None),
            server_port=getattr(conn, "port", None),
            db_namespace=str(getattr(conn, "db", "")),
            error=error,
        )
    except Exception:  # metrics must never break a lock
        pass
