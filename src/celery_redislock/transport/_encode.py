"""Packing script calls: a primitive's keys encoded once, its arguments per call.

redis-py encodes every argument of every command anew; a primitive's keys
never change, so :class:`KeyBlock` encodes them once, in the client's
encoding, and keeps the head of each EVALSHA it has sent (name, sha, key
count, keys) ready to append the call's few arguments to.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

__all__ = ["KeyBlock", "command", "encoding_of", "pack_arg", "pack_command", "send"]

#: Whether commands are packed here (else by the connection, at send time;
#: read per call: bench/transport_paths.py turns it off to compare).
HAND_PACKED = True


def command(*args: Any, encoding: str = "utf-8") -> Any:
    """A command to :func:`send`: packed here, or its arguments."""
    return pack_command(*args, encoding=encoding) if HAND_PACKED else args


def send(conn: Any, commands: list[Any]) -> None:
    """Write ``commands`` (each packed here, or arguments) on ``conn``."""
    if type(commands[0]) is bytes:
        conn.send_packed_command(commands)
    else:
        conn.send_packed_command(conn.pack_commands(commands))


class KeyBlock:
    """The keys of one primitive: as given, encoded, and packed for EVALSHA."""

    __slots__ = ("encoded", "encoding", "heads", "keys", "packed")

    def __init__(self, keys: list[str], encoding: str = "utf-8") -> None:
        self.keys = keys
        self.encoding = encoding
        self.encoded = [key.encode(encoding) for key in keys]
        count = str(len(keys)).encode()
        self.packed = b"$%d\r\n%s\r\n" % (len(count), count) + b"".join(
            [b"$%d\r\n%s\r\n" % (len(k), k) for k in self.encoded]
        )
        #: (script sha, number of args) -> the command up to its first argument.
        self.heads: dict[tuple[str, int], bytes] = {}

    def evalsha(self, sha: str, args: list[Any]) -> Any:
        """``EVALSHA sha <keys> <args>``, packed as the Redis protocol sends it."""
        if not HAND_PACKED:
            return ("EVALSHA", sha, len(self.keys), *self.encoded, *args)
        head = self.heads.get((sha, len(args)))
        if head is None:
            n = 3 + len(self.keys) + len(args)
            head = self.heads[sha, len(args)] = (
                b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % (n, sha.encode()) + self.packed
            )
        encoding = self.encoding
        return head + b"".join([pack_arg(a, encoding) for a in args])

    def evalsha_args(self, sha: str, args: list[Any]) -> list[Any]:
        """The same call as arguments for redis-py's ``execute_command``."""
        return ["EVALSHA", sha, len(self.keys), *self.encoded, *args]


def pack_arg(value: Any, encoding: str = "utf-8") -> bytes:
    """One bulk string of the Redis protocol, encoded as redis-py would."""
    kind = type(value)
    if kind is str:
        data = value.encode(encoding)
    elif kind is int:
        data = b"%d" % value
    elif kind is bytes:
        data = value
    elif isinstance(value, bool) or value is None:
        raise TypeError(f"cannot send {value!r} to Redis")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    elif isinstance(value, str):
        data = str(value).encode(encoding)
    elif isinstance(value, int):
        data = b"%d" % int(value)
    elif isinstance(value, float):
        data = repr(float(value)).encode()
    else:
        raise TypeError(f"cannot send {value!r} to Redis")
    return b"$%d\r\n%s\r\n" % (len(data), data)


def pack_command(*args: Any, encoding: str = "utf-8") -> bytes:
    """A whole command (name first), packed."""
    return b"*%d\r\n" % len(args) + b"".join([pack_arg(a, encoding) for a in args])


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
