"""RateLimiter: at most N starts per period, across every process that shares
a Redis, in one round trip per start.

The sync driver of :mod:`.rates`: one ``rate_acquire`` call takes a slot
on the server's clock (a generic cell rate algorithm), and the caller
sleeps until the slot it took, if any.  Nothing polls: a slot once taken is
the caller's, so a blocked ``acquire`` sleeps exactly as long as it must.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from .. import transport
from . import _errors
from .rates import LimitState, Slot, parse_slot, slot_call

__all__ = ["RateLimiter"]


class RateLimiter(LimitState):
    """At most ``rate`` starts (``"10/s"``, ``"100/m"``, ``"1000/h"``, or
    permits per second) across every client of the same Redis, ``burst`` of
    them at once.

    ``acquire()`` takes a start now, or waits for the next free one;
    ``reserve()`` takes the next free start and says when it is, for a
    scheduler that would rather run the work then than wait for it.
    """

    def __init__(
        self, client: Any, name: str, rate: Any, burst: int = 1, *, prefix: str = "redislock"
    ) -> None:
        super().__init__(client, name, rate, burst, prefix=prefix)
        self._block = transport.KeyBlock([self.key], transport.encoding_of(client))

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take a start: now, or (``blocking``) at the next free slot, sleeping
        until then.  With ``timeout``, a slot further away than that is not
        taken and False comes back at once: nothing can bring it closer."""
        slot = self.take(self.within(blocking, timeout))
        if slot.taken and slot.delay > 0:
            time.sleep(slot.delay)
        return slot.taken

    def reserve(self) -> float:
        """Take the next free start, however far away, and return the seconds
        until it (0.0: now).  The slot is the caller's; it is not given back."""
        return self.take(None).delay

    def take(self, within: Optional[float]) -> Slot:
        """Take the next free start if it is at most ``within`` seconds away
        (0: now only; None: however far), in one round trip.  The
        :class:`~celery_redislock.primitives.rates.Slot` says whether it was
        taken and when it is (or the next free one is)."""
        call = slot_call(self.key, self.limit, within)
        reply = _errors.run(self.client, "acquire", self.key, call.script, self._block, call.args)
        return parse_slot(reply)

    def __enter__(self) -> RateLimiter:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing to give back: a start, once taken, is spent."""

    def __repr__(self) -> str:
        return f"<RateLimiter {self.name!r} {self.limit} burst={self.limit.burst}>"
