"""Semaphore: at most ``limit`` holders at once, each with its own lease.

Unlike the "Redis in Action" counting semaphore (two transactions, racing
between them) every operation is one script call, and unlike a bare permit
counter a crashed holder's permit returns when its own lease runs out.
"""

from __future__ import annotations

from typing import Any

from .. import _validate, transport
from . import _errors, protocol
from ._primitive import Primitive
from .keys import MultiKeys
from .kinds import Kind, Mode
from .state import HoldState

__all__ = ["PermitState", "Semaphore"]


class PermitState(HoldState):
    """What a semaphore is in either driver: its kind, and its checked limit."""

    kind = Kind.SEMAPHORE
    noun = "semaphore"
    mode: Mode = Mode.PERMIT

    def __init__(
        self, client: Any, name: str, limit: int, ttl: float = 30.0, **options: Any
    ) -> None:
        super().__init__(client, name, ttl, **options)
        _validate.check_count(limit, f"limit of {self.noun} {name!r}")
        self.limit = limit


class Semaphore(PermitState, Primitive):
    """A counting semaphore in Redis: at most ``limit`` concurrent holders.

    One object holds at most one permit; use one object per concurrent
    holder.  ``acquire()`` and ``release()`` are one round trip each; waiters
    are served FIFO and woken by releases, not by polling.  Each permit has
    its own lease (renewed in the background while held, like Lock), and
    every grant gets a fencing token.

    Changing the limit: each acquire stores the limit it was given, and
    grants (including hand-overs on release) use the latest stored limit.
    Raising it lets waiters in at once; lowering it revokes nobody, it only
    stops new grants until the holders drop below the new limit.  Give every
    user of one semaphore the same limit.

    Accepts the keyword options of :class:`celery_redislock.Lock`.
    """

    keys: MultiKeys

    @property
    def key(self) -> str:
        return self.keys.holders

    def holders(self) -> int:
        """How many holders have a live lease now (one round trip)."""
        return count_holders(self.client, self.keys)

    def owned(self) -> bool:
        """Whether this object holds a live permit, as Redis sees it (one round trip)."""
        if self._token is None:
            return False
        return bool(self._send("owned", protocol.owned(self.keys, self._token)))


def count_holders(client: Any, k: MultiKeys) -> int:
    """Live holders of the semaphore or read-write lock whose keys are ``k``."""
    call = protocol.count_holders(k)
    block = transport.KeyBlock(call.keys, transport.encoding_of(client))
    return int(_errors.run(client, "count", k.holders, call.script, block, call.args))
