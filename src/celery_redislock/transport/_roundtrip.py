"""One round trip on a connection of the client's pool: a command (and one
more after it, in the same write) sent, and its replies read.

The connection is taken from the pool for the call and given back after it,
as redis-py's own commands do (:mod:`._checkout`), so whatever the pool does
on checkout (Sentinel's master discovery, a bounded pool's wait, a
stale-data check) happens here too.  The command goes out through the
connection's ``send_packed_command`` (health check, connect and authenticate
on demand) and its replies come back, undecoded, through ``read_response``
(the connection's parser and error mapping, RESP3 pushes), under the
connection's retry policy.

A call bounded by the caller's deadline goes instead on a connection of the
library's own (:mod:`._own`), whose connecting is bounded too, and is sent
again only while time is left.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from redis.exceptions import ResponseError

from . import _encode, _own
from ._checkout import checkin, checkout
from ._errors import UNREACHABLE, DeadlineExceeded, translated, unauthenticated

_record: Any
try:  # redis-py >= 7: per-command metrics, when the user has turned them on
    from redis.observability.recorder import record_operation_duration as _record
except ImportError:  # pragma: no cover - older redis-py
    _record = None

__all__ = ["roundtrip"]

#: How many times a deadline-bounded call is sent, at most (a reconnect each time).
_DEADLINE_TRIES = 3


def roundtrip(
    pool: Any,
    command: tuple[Any, ...],
    sends: Optional[list[int]] = None,
    deadline: Optional[float] = None,
    then: Optional[tuple[Any, ...]] = None,
) -> list[Any]:
    """Send ``command`` (and ``then`` after it, in the same write) on a
    connection of ``pool``; their replies.  An error reply to ``command``
    raises once ``then``'s reply has been read too.  ``sends`` and
    ``deadline``: as for :func:`~._calls.call`."""
    # A call bounded by a deadline goes on a connection of our own whose
    # connecting is bounded too, and is retried only while time is left.
    conn = checkout(pool) if deadline is None else _own.take(pool)
    started = time.monotonic()
    commands = [command] if then is None else [command, then]

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
            checkin(pool, conn)
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
