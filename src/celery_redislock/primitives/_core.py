"""What every primitive keeps, and how it sends its script calls.

:class:`Core` holds a primitive's arguments (checked by
:func:`.arguments.check`), its keys, the state of its current hold (token,
fence, when it was granted, whether it was lost) and what the last failed
acquire saw of the holder.  Its calls go through :func:`._errors.run` on
key blocks built once per object; what to send and what a reply means is
:mod:`.protocol`'s.  The operations are added by the classes built on it:
:class:`._release.Releasing`, :class:`._parking.Parking` and
:class:`._primitive.Primitive`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from .. import transport
from . import _errors, _keeper, arguments, protocol, scripts
from .kinds import Kind, Mode
from .protocol import DEFAULT_RESERVE_MS, Handoff, to_ms

if TYPE_CHECKING:
    from .unique import Claim

__all__ = ["Core"]


class Core:
    """The arguments, keys and hold state of a Lock, a Semaphore or a side of
    a ReadWriteLock, and its script calls."""

    #: Which scripts and keys serve it.
    kind: ClassVar[Kind] = Kind.LOCK
    #: What messages call it: "lock", "semaphore", "read lock", "write lock".
    noun: str = "lock"
    #: How a hold is taken (None for a lock: there is one way).
    mode: Optional[Mode] = None
    #: How many may hold it at once, as sent to the scripts (0: not a semaphore).
    limit: int = 0
    keys: Any  # a keys.LockKeys or keys.MultiKeys, set by the subclass

    #: Called with the parked entries a script call of this object granted
    #: (see tasks/parking.py); None: they are left to a recovery sweep.
    on_handoff: Optional[Callable[[list[Handoff]], None]] = None
    #: How long a parked entry this object's calls grant may take to claim it.
    reserve_ms: int = DEFAULT_RESERVE_MS
    #: The claim on a unique key that this object's acquire starts and its
    #: release ends, in the same script calls (see unique.py); set before acquire.
    claim: Optional[Claim] = None
    #: The job that superseded the claim's job, when an acquire refused it for that.
    superseded_by: Optional[str] = None

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: float = 30.0,
        *,
        prefix: str = "redislock",
        timeout: Optional[float] = None,
        renew: bool = True,
        renew_interval: Optional[float] = None,
        owner: str = "",
        on_lost: Optional[Callable[[Any, str], None]] = None,
        fence_retention: float = arguments.DEFAULT_FENCE_RETENTION,
        wait_replicas: int = 0,
        wait_timeout_ms: int = arguments.DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        #: (replicas, timeout ms) every grant, renewal and release waits for
        #: (``WAIT``), or None.
        self.replicas: Optional[tuple[int, int]] = arguments.check(
            self.noun,
            name,
            ttl,
            timeout=timeout,
            renew_interval=renew_interval,
            prefix=prefix,
            fence_retention=fence_retention,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
        )
        self.client = client
        self.name = name
        self.ttl = float(ttl)
        self.timeout = None if timeout is None else float(timeout)
        self.renew_interval = float(renew_interval) if renew_interval is not None else ttl / 3
        self.renew = renew
        self.owner = owner
        self.on_lost = on_lost
        self.prefix = prefix
        self.fence_retention = float(fence_retention)
        #: The fence key outlives every lease (a retried acquire reads it back).
        self._keep_ms = to_ms(max(self.fence_retention, self.ttl))
        #: Fencing token of the current hold, or None when not held.
        self.fence: Optional[int] = None
        #: True once renewal (or release) found that the lease ran out while held.
        self.lost = False
        #: A holder's token and remaining lease (ms) seen by the last failed acquire.
        self.holder: Optional[str] = None
        self.holder_ttl_ms: Optional[int] = None
        #: Local monotonic time the current lease began, at the earliest.
        self.granted_at: Optional[float] = None
        self._token: Optional[str] = None
        #: Local send time and server time (ms) of the last queued attempt.
        self._sent = 0.0
        self._server_ms = 0
        self._block: Optional[transport.KeyBlock] = None
        self._lease_block: Optional[transport.KeyBlock] = None

    @property
    def key(self) -> str:
        """The key that exists while the primitive is held (the lease lives there)."""
        return protocol.lead_key(self.keys)

    @property
    def token(self) -> Optional[str]:
        """The owner token of the current hold, or None."""
        return self._token

    def __repr__(self) -> str:
        state = f"held fence={self.fence}" if self._token else "not held"
        return f"<{type(self).__name__} {self.name!r} {state}>"

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
        packed: Optional[bytes] = None,
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
        if not handoffs:
            return
        if self.on_handoff is None:
            _keeper.logger.error(
                "%s %r granted %d parked task(s) but has no on_handoff to re-publish them; "
                "they are re-published when their reservation lapses",
                self.noun,
                self.name,
                len(handoffs),
            )
            return
        self.on_handoff(handoffs)

    def _granted(self, token: str, fence: int, start: float) -> bool:
        """Held under ``token``; ``start`` is the local time the lease began at
        the earliest (renewal and the lost timer count from there)."""
        self._token = token
        self.fence = fence
        self.granted_at = start
        self.lost = False
        self.holder = self.holder_ttl_ms = None
        if self.renew:
            _keeper.keeper().add(self, token)
        return True

    def _mark_lost(self, reason: str) -> None:
        self.lost = True
        if self.on_lost is not None:
            try:
                self.on_lost(self, reason)
            except Exception:
                _keeper.logger.exception("on_lost callback of %r failed", self)
        _keeper.notify_lost(self, reason)

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
