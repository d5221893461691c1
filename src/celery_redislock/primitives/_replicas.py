"""``wait_replicas``: what a call the replicas did not acknowledge in time leads to.

Every grant, renewal and release of a primitive with ``wait_replicas`` is
followed by ``WAIT`` on the same connection (:func:`transport.call`).  A
grant they did not acknowledge is undone (a failover now could give it to
someone else too), a parked entry taken back (a failover now would lose it,
and its message is in no broker any more); a release or a renewal cannot be
taken back, so its shortfall is only logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _keeper, protocol

if TYPE_CHECKING:
    from ._core import Core
    from ._parking import Parking

__all__ = ["shortfall", "undo", "unpark"]


def shortfall(prim: Core, reply_and_acked: tuple[Any, int], op: str) -> Any:
    """The reply of a call that waited for replicas; a shortfall is logged
    (a release or an extension cannot be taken back)."""
    reply, acked = reply_and_acked
    wanted, timeout_ms = prim.replicas  # type: ignore[misc]
    if acked < wanted:
        _keeper.logger.warning(
            "%s %r: %s acknowledged by %d of %d replicas within %d ms",
            prim.noun,
            prim.name,
            op,
            acked,
            wanted,
            timeout_ms,
        )
    return reply


def undo(prim: Core, token: str, acked: int) -> None:
    """Release a grant the replicas did not acknowledge in time: it counts
    as not acquired (a failover now could give it to someone else too)."""
    _keeper.logger.warning(
        "%s %r: grant acknowledged by %d of %d replicas within %d ms; undone",
        prim.noun,
        prim.name,
        acked,
        *prim.replicas,  # type: ignore[misc]
    )
    prim.holder = prim.holder_ttl_ms = None
    args = protocol.release_args(
        prim.keys, token, prim._keep_ms, reserve_ms=prim.reserve_ms, claim=prim.claim
    )
    released = protocol.parse_release(prim._call("release", prim.kind.scripts.release, args))
    if released.held:
        prim._hand_over(released.handoffs)


def unpark(prim: Parking, token: str, acked: int) -> None:
    """Take back a parked entry the replicas did not acknowledge in time: a
    failover now would lose it, and its message is in no broker any more."""
    _keeper.logger.warning(
        "%s %r: parked entry acknowledged by %d of %d replicas within %d ms; taken back",
        prim.noun,
        prim.name,
        acked,
        *prim.replicas,  # type: ignore[misc]
    )
    prim._drop(token, "acquire")
