"""The reply reader of the hot path (resp.py), on canned bytes.

Pure parsing, so a stand-in socket is enough; test_wire.py runs it against a
real redis-server.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

from celery_redislock import resp


class Chunks:
    """A socket whose recv() returns the given chunks, then EOF."""

    def __init__(self, *chunks: bytes | BaseException) -> None:
        self.chunks = list(chunks)
        self.calls = 0

    def recv(self, size: int) -> bytes:
        self.calls += 1
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if isinstance(chunk, BaseException):
            raise chunk
        return chunk


def read(*chunks: bytes | BaseException) -> Any:
    return resp.read_reply(Chunks(*chunks))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b":42\r\n", 42),
        (b":-3\r\n", -3),
        (b"$5\r\nhello\r\n", b"hello"),
        (b"$0\r\n\r\n", b""),
        (b"$-1\r\n", None),
        (b"*-1\r\n", None),
        (b"_\r\n", None),
        (b"+OK\r\n", b"OK"),
        (b"#t\r\n", True),
        (b",2.5\r\n", 2.5),
        (b"(12345678901234567890\r\n", 12345678901234567890),
        (b"=7\r\ntxt:abc\r\n", b"abc"),
        (b"*0\r\n", []),
        (b"*3\r\n:1\r\n$4\r\na\r\nb\r\n$-1\r\n", [1, b"a\r\nb", None]),
        (b"*2\r\n*1\r\n:1\r\n~1\r\n+x\r\n", [[1], [b"x"]]),
        (b"%1\r\n+k\r\n:1\r\n", {b"k": 1}),
    ],
)
def test_every_reply_type_reads_as_redis_py_returns_it(data: bytes, expected: Any) -> None:
    assert read(data) == expected


def test_a_reply_split_anywhere_is_read_whole() -> None:
    data = b"*4\r\n:1\r\n:2\r\n$-1\r\n$10\r\n0123456789\r\n"
    for cut in range(1, len(data)):
        assert read(data[:cut], data[cut:]) == [1, 2, None, b"0123456789"]
    one_byte_at_a_time = [data[i : i + 1] for i in range(len(data))]
    assert read(*one_byte_at_a_time) == [1, 2, None, b"0123456789"]


def test_error_replies_come_back_as_the_exceptions_redis_py_raises() -> None:
    noscript = read(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
    assert isinstance(noscript, NoScriptError)
    other = read(b"-ERR something went wrong\r\n")
    assert type(other) is ResponseError and "something went wrong" in str(other)
    blob = read(b"!21\r\nSYNTAX invalid syntax\r\n")
    assert isinstance(blob, ResponseError) and "invalid syntax" in str(blob)


def test_push_messages_before_the_reply_are_skipped() -> None:
    push = b">3\r\n+invalidate\r\n*1\r\n$1\r\nk\r\n:1\r\n"
    assert read(push + b":7\r\n") == 7
    assert read(push, b":7\r\n") == 7  # the reply comes in a later recv
    assert read(push + b":", b"7\r\n") == 7


def test_a_closed_connection_or_a_timeout_is_reported_as_redis_py_does() -> None:
    with pytest.raises(ConnectionError, match="closed"):
        read()
    with pytest.raises(ConnectionError, match="closed"):
        read(b"$10\r\n0123")  # EOF in the middle of a reply
    with pytest.raises(TimeoutError):
        read(socket.timeout("timed out"))
    with pytest.raises(ConnectionError, match="reset"):
        read(ConnectionResetError("connection reset"))


def test_anything_after_the_reply_is_a_protocol_error() -> None:
    # Only one command is ever in flight when a reply is read, so more bytes
    # mean the stream is out of step: never guess which reply is whose.
    with pytest.raises(ConnectionError, match="more data than one reply"):
        read(b":1\r\n:2\r\n")
    with pytest.raises(ConnectionError, match="unexpected reply type"):
        read(b"?what\r\n")


def test_several_replies_read_in_order_across_chunks() -> None:
    sock = Chunks(b"+OK\r\n+QUEUED\r\n+QUE", b"UED\r\n*2\r\n:1\r\n$2\r\nok\r\n")
    got = resp.read_replies(sock, 4)  # type: ignore[arg-type]
    assert got == [b"OK", b"QUEUED", b"QUEUED", [1, b"ok"]]
    assert sock.calls == 2


def test_several_replies_skip_pushes_and_keep_errors_as_values() -> None:
    sock = Chunks(b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n+OK\r\n", b"-NOSCRIPT gone\r\n")
    first, second = resp.read_replies(sock, 2)  # type: ignore[arg-type]
    assert first == b"OK" and isinstance(second, NoScriptError)


def test_more_data_than_the_replies_is_a_protocol_error() -> None:
    with pytest.raises(ConnectionError, match="more data"):
        resp.read_replies(Chunks(b"+OK\r\n+OK\r\n+OK\r\n"), 2)  # type: ignore[arg-type]


def test_a_connection_closed_between_replies_is_reported() -> None:
    with pytest.raises(ConnectionError, match="closed"):
        resp.read_replies(Chunks(b"+OK\r\n"), 2)  # type: ignore[arg-type]
