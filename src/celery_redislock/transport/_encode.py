"""A primitive's keys, encoded once, and the commands that carry them.

:class:`KeyBlock` holds the keys of one primitive: as given (a cluster finds
their node by them) and encoded once in the client's encoding (redis-py
encodes every argument of every command anew; a primitive's keys never
change).  A command is its arguments, packed by the connection that sends it
(its ``pack_command``, as redis-py's own commands are: :func:`send`), or
handed to a client's ``execute_command`` or pipeline.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

__all__ = ["KeyBlock", "encoding_of", "send"]


class KeyBlock:
    """The keys of one primitive: as given, and encoded."""

    __slots__ = ("encoded", "encoding", "keys")

    def __init__(self, keys: list[str], encoding: str = "utf-8") -> None:
        self.keys = keys
        self.encoding = encoding
        self.encoded = [key.encode(encoding) for key in keys]

    def evalsha(self, sha: str, args: list[Any]) -> Any:
        """``EVALSHA sha <keys> <args>``: the command's arguments (a tuple)."""
        return ("EVALSHA", sha, len(self.encoded), *self.encoded, *args)


def send(conn: Any, commands: list[Any]) -> None:
    """Write ``commands`` (each a tuple of arguments) on ``conn``, in one write."""
    if len(commands) == 1:
        conn.send_packed_command(conn.pack_command(*commands[0]))
    else:
        conn.send_packed_command(conn.pack_commands(commands))


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
