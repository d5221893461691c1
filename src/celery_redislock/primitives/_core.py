"""The sync driver's base: a primitive's state, and how it sends its script calls.

:class:`Core` is a primitive's :class:`.state.HoldState` (its checked
arguments, keys and the state of its current hold) with the sync driver's
calls: through :func:`._errors.run`, on key blocks built once per object;
what to send and what a reply means is :mod:`.protocol`'s.  The operations
are added by the classes built on it: :class:`._release.Releasing`,
:class:`._parking.Parking` and :class:`._primitive.Primitive`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from .. import transport
from . import _errors, _keeper, protocol, scripts
from .protocol import Handoff, Start, to_ms
from .state import HoldState

if TYPE_CHECKING:
    from .unique import Claim

__all__ = ["Core"]


class Core(HoldState):
    """A Lock, a Semaphore or a side of a ReadWriteLock (:class:`.state.HoldState`)
    and its script calls."""

    #: Called with the parked entries a script call of this object granted
    #: (see tasks/parking.py); None: they are left to a recovery sweep.
    on_handoff: Optional[Callable[[list[Handoff]], None]] = None
    #: The claim on a unique key that this object's acquire starts and its
    #: release ends, in the same script calls (see unique.py); set before acquire.
    claim: Optional[Claim] = None
    #: The job that superseded the claim's job, when an acquire refused it for that.
    superseded_by: Optional[str] = None
    #: A start under a rate limit that this object's next acquire that does not
    #: wait takes with the lock, in the same script call (see rates.py); set
    #: before acquire.  When none was free: the seconds until one is.
    start: Optional[Start] = None
    over_rate_for: Optional[float] = None

    def __init__(self, client: Any, name: str, ttl: float = 30.0, **options: Any) -> None:
        super().__init__(client, name, ttl, **options)
        self._block: Optional[transport.KeyBlock] = None
        self._lease_block: Optional[transport.KeyBlock] = None

    # -- calls -----------------------------------------------------------------

    def _keyblock(self) -> transport.KeyBlock:
        """The keys of every acquire, release and cancel call, packed once."""
        block = self._block
        if block is None:
            block = self._block = transport.KeyBlock(
                protocol.script_keys(self.keys, self.claim), transport.encoding_of(self.client)
            )
        return block

    def _call(
        self,
        op: str,
        script: str,
        args: list[Any],
        *,
        block: Optional[transport.KeyBlock] = None,
        sends: Optional[list[int]] = None,
        deadline: Optional[float] = None,
        replicas: Optional[tuple[int, int]] = None,
        packed: Any = None,
    ) -> Any:
        """Run one of the primitive's scripts (on :meth:`_keyblock`'s keys
        unless ``block``): one round trip; see :func:`._errors.run`."""
        return _errors.run(
            self.client,
            op,
            self.key,
            script,
            block or self._keyblock(),
            args,
            sends=sends,
            deadline=deadline,
            replicas=replicas,
            packed=packed,
        )

    def _send(self, op: str, call: protocol.Call, **options: Any) -> Any:
        """Run ``call`` on keys of its own (a call off the hot path)."""
        block = transport.KeyBlock(call.keys, transport.encoding_of(self.client))
        return self._call(op, call.script, call.args, block=block, **options)

    def _redis(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A plain redis-py command, with "cannot reach Redis" as BackendUnavailable."""
        return _errors.guard(op, self.key, fn, *args)

    # -- what a call's outcome does to this object ---------------------------------

    def _hand_over(self, handoffs: list[Handoff]) -> None:
        """Pass the parked runs a call granted to :attr:`on_handoff`."""
        handler = self.on_handoff
        if handoffs and not self._unhandled(handoffs) and handler is not None:
            handler(handoffs)

    def _granted(self, token: str, fence: int, start: float) -> bool:
        """Held under ``token``; ``start`` is the local time the lease began at
        the earliest (renewal and the lost timer count from there)."""
        self._hold(token, fence, start)
        if self.renew:
            _keeper.keeper().add(self, token)
        return True

    # -- renewal (the keeper calls this) ---------------------------------------------

    def _renewal(
        self, token: str, seconds: Optional[float] = None
    ) -> tuple[protocol.Call, transport.KeyBlock]:
        """The call that renews the hold of ``token``, and its keys packed once."""
        call = protocol.extend(self.kind, self.keys, token, to_ms(seconds or self.ttl))
        block = self._lease_block
        if block is None:
            block = self._lease_block = transport.KeyBlock(
                call.keys, transport.encoding_of(self.client)
            )
        return call, block

    def _renew_call(
        self, token: str, seconds: Optional[float] = None
    ) -> tuple[Any, transport.KeyBlock, list[Any]]:
        """(script, keys, args) that renews the hold of ``token``; the reply
        parses with :func:`.protocol.parse_extend`."""
        call, block = self._renewal(token, seconds)
        return scripts.get(call.script), block, call.args
