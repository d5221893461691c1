"""Parked entries of a primitive's line: take one back, recover the forgotten.

A queue entry may be a parked payload instead of a blocked caller (the
Celery side's ``on_contention="park"``): :meth:`._primitive.Primitive.park`
puts one there.  A script call that grants such an entry returns its payload,
which the primitive hands to ``on_handoff`` for whoever parked it to
re-publish; :meth:`Parking.recover` re-grants the entries nobody would wake
(their reservation lapsed, or the holder crashed), and
:meth:`Parking.drop_parked` takes one out of line.
"""

from __future__ import annotations

from typing import Optional

from . import protocol
from ._release import Releasing

__all__ = ["Parking"]


class Parking(Releasing):
    """A primitive's operations on the parked entries of its line."""

    def recover(self) -> int:
        """Re-grant the parked entries nobody else would wake (crash
        recovery), handing them to :attr:`on_handoff`; one round trip.

        Returns when (server ms) it should be called again, or -1 when
        nothing is parked any more.
        """
        call = protocol.recover(self.kind, self.keys, self._keep_ms, self.reserve_ms)
        recovered = protocol.parse_recover(self._call("recover", call.script, call.args))
        self._hand_over(recovered.handoffs)
        return recovered.next_check_ms

    def drop_parked(self, token: str) -> Optional[bytes]:
        """Take the entry parked under ``token`` out of line; its payload, or
        None when no entry is parked under it.  An entry already granted (in
        flight) held the primitive under its token: that hold is released,
        serving the next in line.  One round trip, two for one in flight."""
        return self._drop(token, "drop")

    def _drop(self, token: str, op: str) -> Optional[bytes]:
        dropped = protocol.parse_park_drop(self._send(op, protocol.park_drop(self.keys, token)))
        if dropped is None:
            return None
        payload, granted = dropped
        if granted:  # held under its token: release that hold
            args = protocol.release_args(
                self.keys, token, self._keep_ms, reserve_ms=self.reserve_ms, claim=self.claim
            )
            released = protocol.parse_release(
                self._call("release", self.kind.scripts.release, args)
            )
            if released.held:
                self._hand_over(released.handoffs)
        return payload if isinstance(payload, bytes) else str(payload).encode()
