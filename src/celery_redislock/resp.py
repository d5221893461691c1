"""Read one reply of the Redis protocol (RESP2 or RESP3) from a socket.

Only for the hot path of :mod:`wire`, which owns the connection it reads
from, so nothing is ever buffered between replies: every byte received
belongs to the reply of the one command just sent.  Replies come back as
redis-py returns them without ``decode_responses``: ``int``, ``bytes``,
``None`` and lists of those.  Error replies are returned (not raised) as the
exception redis-py would raise, so the caller can tell "Redis said no" (the
connection is fine) from a broken connection.  Out-of-band RESP3 push
messages read before the reply are skipped.
"""

from __future__ import annotations

import socket
from typing import Any

from redis.exceptions import ConnectionError, ResponseError, TimeoutError

try:  # the parser's own error table (NOSCRIPT, READONLY, ...), where it exists
    from redis._parsers.base import BaseParser

    _parse_error: Any = BaseParser.parse_error
except ImportError:  # pragma: no cover - other redis-py layouts
    _parse_error = ResponseError

__all__ = ["Push", "read_replies", "read_reply"]

_CHUNK = 65536


class _Incomplete(Exception):
    """The buffer ends before the reply does."""


class Push(list):  # type: ignore[type-arg]
    """An out-of-band RESP3 push message (not the reply of a command)."""


def _parse(buf: bytes, pos: int) -> tuple[Any, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    line = buf[pos + 1 : end]
    pos = end + 2
    if kind == 58:  # ':' integer
        return int(line), pos
    if kind == 36 or kind == 33 or kind == 61:  # '$' bulk, '!' bulk error, '=' verbatim
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise _Incomplete
        data = buf[pos : pos + n]
        if kind == 33:
            return _parse_error(data.decode("utf-8", "replace")), pos + n + 2
        return (data[4:] if kind == 61 else data), pos + n + 2
    if kind == 42 or kind == 62 or kind == 126:  # '*' array, '>' push, '~' set
        n = int(line)
        if n < 0:
            return None, pos
        items: list[Any] = Push() if kind == 62 else []
        for _ in range(n):
            item, pos = _parse(buf, pos)
            items.append(item)
        return items, pos
    if kind == 95:  # '_' null
        return None, pos
    if kind == 43:  # '+' simple string
        return line, pos
    if kind == 45:  # '-' error
        return _parse_error(line.decode("utf-8", "replace")), pos
    if kind == 35:  # '#' boolean
        return line == b"t", pos
    if kind == 44:  # ',' double
        return float(line), pos
    if kind == 40:  # '(' big number
        return int(line), pos
    if kind == 37:  # '%' map
        n = int(line)
        pairs: dict[Any, Any] = {}
        for _ in range(n):
            k, pos = _parse(buf, pos)
            v, pos = _parse(buf, pos)
            pairs[k] = v
        return pairs, pos
    raise ConnectionError(f"protocol error: unexpected reply type {chr(kind)!r}")


def _recv(sock: socket.socket) -> bytes:
    try:
        data = sock.recv(_CHUNK)
    except socket.timeout as exc:
        raise TimeoutError("Timeout reading from the lock store") from exc
    except OSError as exc:
        raise ConnectionError(f"Error while reading from the lock store: {exc}") from exc
    if not data:
        raise ConnectionError("Connection closed by server.")
    return data


def read_reply(sock: socket.socket) -> Any:
    """The reply of the one command just sent on ``sock``; errors come back as values."""
    data = _recv(sock)
    while True:
        try:
            reply, pos = _parse(data, 0)
        except _Incomplete:
            data += _recv(sock)
            continue
        if pos != len(data):
            if isinstance(reply, Push):  # then the reply itself
                data = data[pos:]
                continue
            raise ConnectionError("protocol error: more data than one reply")
        if isinstance(reply, Push):
            data = _recv(sock)
            continue
        return reply


def read_replies(sock: socket.socket, count: int) -> list[Any]:
    """The replies of the ``count`` commands just sent on ``sock`` together, in order."""
    data = _recv(sock)
    pos = 0
    replies: list[Any] = []
    while len(replies) < count:
        try:
            reply, end = _parse(data, pos)
        except _Incomplete:
            data += _recv(sock)
            continue
        pos = end
        if not isinstance(reply, Push):
            replies.append(reply)
    if pos != len(data):
        raise ConnectionError("protocol error: more data than the replies")
    return replies
