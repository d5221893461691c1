"""A script call sent now and its reply read later (a release sent as a task's
body ends, its outcome read once the result is stored).

The connection stays out of the pool until the reply is read, and is closed
if it never is: a reply left unread must never be taken for the next
command's.  Where a call cannot be split (a cluster, or another client whose
commands go through its ``execute_command``), it is made in full when sent.
"""

from __future__ import annotations

from typing import Any, Optional

from redis.exceptions import NoScriptError, ResponseError

from . import _encode
from ._checkout import checkin, checkout, pool_of
from ._encode import KeyBlock
from ._errors import UNREACHABLE, ReplyLost, translated
from ._execute import execute
from ._noscript import loaded_one
from ._roundtrip import roundtrip

__all__ = ["Reply", "call_soon"]

#: Script is a redis-py ``Script`` (or anything with ``sha`` and ``script``).
Script = Any


def call_soon(
    client: Any, script: Script, block: KeyBlock, args: list[Any], packed: Any = None
) -> Reply:
    """Send the call now and return its :class:`Reply`, to be read later
    (``packed``: as for :func:`~._calls.call`)."""
    pool = pool_of(client)
    if pool is None:
        try:
            return Reply.done(execute(client, script, block, args))
        except Exception as exc:
            return Reply.done(None, exc)
    if packed is None:
        packed = block.evalsha(script.sha, args)
    conn = checkout(pool)

    def send() -> None:
        conn.connect()  # (no-op when connected; see _roundtrip)
        _encode.send(conn, [packed])

    try:
        conn.retry.call_with_retry(send, lambda error: conn.disconnect())
    except BaseException:
        checkin(pool, conn)
        raise
    return Reply(client, pool, conn, script, packed)


class Reply:
    """The reply of a command sent by :func:`call_soon`; :meth:`get` reads it once."""

    __slots__ = ("_call", "_conn", "_error", "_pool", "_value", "client")

    def __init__(
        self, client: Any, pool: Any, conn: Any, script: Script = None, packed: Any = None
    ) -> None:
        self.client = client
        self._pool = pool
        self._conn = conn
        self._call = (script, packed)
        self._value: Any = None
        self._error: Optional[BaseException] = None

    @classmethod
    def done(cls, value: Any, error: Optional[BaseException] = None) -> Reply:
        """A Reply already read: ``value``, or ``error`` raised by :meth:`get`."""
        reply = cls(None, None, None)
        reply._value, reply._error = value, error
        return reply

    @property
    def pending(self) -> bool:
        return self._conn is not None

    def get(self) -> Any:
        """The reply; raises what :func:`~._calls.call` would, or :class:`ReplyLost`
        when the connection broke after the command was sent."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            try:
                self._value = conn.read_response(disable_decoding=True)
            except NoScriptError as unknown:
                checkin(self._pool, conn)
                self._value = self._resend(unknown)
            except ResponseError as exc:
                error = translated(exc, conn)
                checkin(self._pool, conn)
                if isinstance(error, ResponseError):
                    self._error = error
                else:  # (a demoted master: nothing ran)
                    self._error = ReplyLost(f"reply lost: {error!r}")
                    self._error.__cause__ = error
            except BaseException as exc:
                conn.disconnect()  # the reply may still come: never hand it on
                checkin(self._pool, conn)
                if not isinstance(exc, UNREACHABLE):
                    raise  # an interruption (a soft time limit): let it through
                self._error = ReplyLost(f"reply lost: {exc!r}")
                self._error.__cause__ = exc
            else:
                checkin(self._pool, conn)
        if self._error is not None:
            raise self._error
        return self._value

    def _resend(self, unknown: NoScriptError) -> Any:
        """The call again, once its script is loaded (it ran nothing)."""
        script, packed = self._call
        pool, client = self._pool, self.client

        def send() -> Any:
            return roundtrip(pool, packed)[0]

        def load(script: Script) -> Any:
            return client.script_load(script.script)

        return loaded_one(send, script, load, unknown)

    def __del__(self) -> None:
        conn = self._conn
        if conn is not None:  # never read: the connection is out of step
            try:
                conn.disconnect()
                checkin(self._pool, conn)
            except Exception:  # interpreter shutdown, a closed pool
                pass
