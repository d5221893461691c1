"""A primitive's keys, encoded once, and the commands that carry them.

:class:`KeyBlock` holds the keys of one primitive: as given (a cluster finds
their node by them) and encoded once in the client's encoding (redis-py
encodes every argument of every command anew; a primitive's keys never
change).  A command is its arguments, packed by the connection that sends it
(its ``pack_command``, as redis-py's own commands are: :func:`send`), or
handed to a client's ``execute_command`` or pipeline.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable

__all__ = ["KeyBlock", "Packed", "encoding_of", "prepack", "send"]


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


class Packed(list):  # type: ignore[type-arg]
    """A command already packed (a list of bytes), by :func:`prepack`."""

    __slots__ = ()


#: The attribute of a pool that holds the ``pack_command`` of a connection of
#: its own class and settings, made once and never connected.
_PACKER = "_celery_redislock_packer"


def prepack(pool: Any, command: tuple[Any, ...]) -> Any:
    """``command`` packed now, by redis-py's own ``pack_command`` of a
    connection of ``pool``'s class and settings, to be sent later as it is.

    For a release, packed when the acquire starts: packing in code that has
    just woken up (a release after a hold) costs several times what it does
    in a tight loop, and sits between the release call and its send: measured,
    a hand-over median of 0.92x (0.88-0.95x over 10 batches of
    bench/revisions.py, against the same code packing at send time).  The
    packing is redis-py's own, only done earlier.  Where no packer can be
    made, ``command`` itself (packed by the sending connection).
    """
    packer: Any = getattr(pool, _PACKER, None)
    if packer is None:
        try:
            packer = pool.connection_class(**pool.connection_kwargs).pack_command
        except Exception:  # (a connection class that needs more: pack at send)
            packer = False
        with contextlib.suppress(AttributeError):  # (a pool with slots: made again)
            setattr(pool, _PACKER, packer)
    return Packed(packer(*command)) if packer else command


def send(conn: Any, commands: list[Any]) -> None:
    """Write ``commands`` (each a tuple of arguments, or :class:`Packed`) on
    ``conn``, in one write."""
    if len(commands) == 1:
        command = commands[0]
        conn.send_packed_command(
            command if type(command) is Packed else conn.pack_command(*command)
        )
        return
    chunks: list[bytes] = []
    for command in commands:
        chunks += command if type(command) is Packed else conn.pack_command(*command)
    conn.send_packed_command(chunks)


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
