"""The protocol every primitive shares: acquire-or-wait, park, release, renewal.

A subclass names its kind, keys and mode; :class:`Primitive` runs the protocol,
each step one call built and parsed by :mod:`.protocol`:

- ``acquire`` sends one script call.  Uncontended, that is the only round
  trip.  Contended and blocking, the script has queued the caller (FIFO) and
  returned the holder's remaining lease; the caller then BLPOPs its own wake
  list, which a release pushes the fence to when it hands over.  The BLPOP is
  bounded by the holder's lease, so a crashed holder costs at most that, after
  which the caller asks again, keeping its place.  Giving up sends a cancel,
  which also catches a grant that raced with the timeout.
- ``park`` is an acquire that, contended, leaves a payload in line instead of
  waiting (see :mod:`._parking`).
- ``release`` is one script call that also hands over to the next in line
  (:mod:`._release`).
- While held, the per-process keeper (``_keeper.py``) renews the lease.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

from .. import _validate, transport
from ..exceptions import BackendUnavailable, LockError, LockLost, LockNotOwned
from . import _errors, _keeper, _replicas, protocol
from ._parking import Parking
from .protocol import FOREVER_MS, Duplicate, Granted, OverRate, Queued, Superseded, to_ms
from .tokens import new_token

__all__ = [
    "DUPLICATE",
    "HELD",
    "OVER_RATE",
    "QUEUED",
    "SUPERSEDED",
    "UNREPLICATED",
    "Primitive",
]

#: What one acquire call did (:meth:`Primitive._attempt`).
HELD = 1  #: held now
QUEUED = 0  #: not held: in line, parked, or not waiting at all
DUPLICATE = -1  #: a parked run's second delivery, its grant already claimed
SUPERSEDED = -2  #: a claim whose job a newer publish replaced
UNREPLICATED = -3  #: parked, but the replicas did not acknowledge it: taken back
OVER_RATE = -4  #: no start free under the rate limit the call carried: nothing taken

#: What :meth:`Primitive.park` returns for each.
_PARK_STATUS = {
    HELD: "held",
    QUEUED: "parked",
    DUPLICATE: "duplicate",
    SUPERSEDED: "superseded",
    UNREPLICATED: "unreplicated",
    OVER_RATE: "over rate",
}
#: Consecutive failed waits (the wait connection broke) before acquire gives up.
_WAIT_FAILURES = 2
#: A wait that ends this close to the caller's deadline was its last one, s.
_LAST_WAIT = 0.05


class Primitive(Parking):
    """Base of Lock, Semaphore and the sides of ReadWriteLock."""

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take it; True when held, False when not (non-blocking, or timed out).

        ``timeout`` None with ``blocking`` waits forever.
        """
        if timeout is not None:
            if not blocking:
                raise ValueError("can't specify a timeout for a non-blocking acquire")
            _validate.check_seconds(timeout, f"acquire timeout of {self.noun} {self.name!r}")
        token = self._new_token()
        self._release_call(token)  # ready for release(), before anything waits
        if not blocking:  # one attempt, the common case of a task's lock
            return self._attempt(token, 0) == HELD
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        # With a timeout, every call is bounded by it too (a stalled
        # connection, a reconnect), and giving up by one connect timeout more.
        by = None if timeout is None else deadline

        def attempt() -> int:
            left = deadline - time.monotonic()
            if left <= 0:
                return QUEUED  # out of time: give up below
            wait = FOREVER_MS if left == math.inf else max(1, int(left * 1000))
            try:
                return self._attempt(token, wait, deadline=by)
            except BackendUnavailable as exc:
                if isinstance(exc.__cause__, transport.DeadlineExceeded):
                    return QUEUED  # out of time: give up below
                raise

        status = attempt()
        failures = 0
        while status == QUEUED:
            left = deadline - time.monotonic()
            if left <= 0:
                return self._give_up(token)
            # Block until a release hands over, or until the holder's lease
            # would have run out (it may have crashed); then ask again.
            block = min(left, max(self.holder_ttl_ms or 1, 1) / 1000.0 + 0.002)
            try:
                popped = transport.wait_pop(self.client, self.keys.wake + token, block, by)
            except transport.UNREACHABLE as exc:
                failures += 1
                if failures >= _WAIT_FAILURES:
                    self._give_up_quietly(token)
                    raise _errors.unreachable("acquire", self.key, exc) from exc
                popped = None
            else:
                failures = 0
            if popped is None and time.monotonic() >= deadline - _LAST_WAIT:
                # The wait ran to the deadline (ending a little early, to be
                # read by then): give up at the deadline, not before; a grant
                # made meanwhile is found by the give-up.
                time.sleep(max(0.0, deadline - time.monotonic()))
                return self._give_up(token)
            if popped is not None:
                fence, granted_ms = protocol.parse_wake(popped)
                start = protocol.lease_start(self._sent, self._server_ms, granted_ms)
                fresh = start + self.ttl > time.monotonic()
                if fresh and self.replicas is None and self.claim is None:
                    return self._granted(token, fence, start)
                # With a claim, the grant is confirmed by a call of our own,
                # which starts the claim's run.
                # With wait_replicas, the grant is confirmed by a write of
                # our own that the replicas acknowledge (the releaser's WAIT
                # covered its own connection's writes, for its own sake).
                # The wake-up came too late (a stalled connection, a paused
                # process): the lease it granted may have run out, and even
                # been granted again.  Ask once more with the same token: a
                # lease still ours is renewed and confirmed, else we queue.
            status = attempt()
        return status == HELD

    def park(
        self,
        token: str,
        payload: bytes | str,
        *,
        parked_run: bool = False,
        order_ms: Optional[float] = None,
    ) -> str:
        """Take it now under ``token``, or leave ``payload`` in its FIFO line
        under ``token``, for whoever's call grants it to hand to its
        ``on_handoff``; one round trip.

        Returns ``"held"``, ``"parked"``, ``"duplicate"`` when ``parked_run``
        (the call is the re-published run of a parked entry, presenting its
        token) and that token's grant was already claimed (a second delivery),
        ``"superseded"`` when the primitive carries a unique job's claim and a
        newer publish replaced that job, or ``"unreplicated"`` when the
        primitive waits for replicas and they did not acknowledge the parked
        entry in time (it was taken back: not parked).  ``order_ms`` places
        the entry in line (its publish time); default: arrival.
        """
        if self._token is not None:
            raise LockError(f"{self.noun} {self.name!r} is already held by this object", self.key)
        status = self._attempt(token, 0, payload, parked_run=parked_run, order_ms=order_ms)
        return _PARK_STATUS[status]

    def _new_token(self) -> str:
        if self._token is not None:
            raise LockError(f"{self.noun} {self.name!r} is already held by this object", self.key)
        return new_token(self.owner)

    def _attempt(
        self,
        token: str,
        wait_ms: int,
        payload: bytes | str = "",
        *,
        parked_run: bool = False,
        order_ms: Optional[float] = None,
        deadline: Optional[float] = None,
    ) -> int:
        """One acquire call: HELD, QUEUED (in line or parked, or not waiting),
        DUPLICATE, SUPERSEDED (see :attr:`superseded_by`), UNREPLICATED or
        OVER_RATE (see :attr:`over_rate_for`)."""
        # A call that waits, or a parked run's claim of its grant, never
        # carries a start: the lock would be granted later, by a release.
        start = self.start if wait_ms == 0 and not parked_run else None
        block = None
        if start is not None:
            keys = protocol.script_keys(self.keys, self.claim, start)
            block = transport.KeyBlock(keys, transport.encoding_of(self.client))
        args = protocol.acquire_args(
            self.keys,
            token,
            to_ms(self.ttl),
            wait_ms,
            self._keep_ms,
            mode=self.mode,
            limit=self.limit,
            payload=payload,
            reserve_ms=self.reserve_ms,
            parked_run=parked_run,
            order_ms=order_ms,
            claim=self.claim,
            start=start,
        )
        sent = time.monotonic()
        reply = self._call(
            "acquire",
            self.kind.scripts.acquire,
            args,
            block=block,
            deadline=deadline,
            replicas=self.replicas,
        )
        if self.replicas is not None:
            reply, acked = reply
            result = protocol.parse_acquire(reply)
            if acked < self.replicas[0]:
                if type(result) is Granted:
                    _replicas.undo(self, token, acked)
                    self._hand_over(result.handoffs)
                    return QUEUED
                if payload and type(result) is Queued:
                    self.holder, self.holder_ttl_ms = result.holder, result.holder_ttl_ms
                    self._hand_over(result.handoffs)
                    _replicas.unpark(self, token, acked)
                    return UNREPLICATED
        elif isinstance(reply, int):  # held, nothing to hand over: the bare fence
            self._granted(token, reply, sent)
            return HELD
        else:
            result = protocol.parse_acquire(reply)
        self._hand_over(result.handoffs)
        if type(result) is Granted:
            self._granted(token, result.fence, sent)
            return HELD
        if type(result) is Queued:
            self._queued(result, sent)
            return QUEUED
        if type(result) is Superseded:
            self.superseded_by = result.by
            return SUPERSEDED
        if type(result) is OverRate:
            self.over_rate_for = result.delay
            return OVER_RATE
        assert type(result) is Duplicate
        return DUPLICATE

    def _give_up(self, token: str) -> bool:
        """Leave the queue, within one connect timeout."""
        by = time.monotonic() + transport.connect_timeout(self.client)
        call = protocol.cancel(self.kind, self.keys, token, self._keep_ms, self.reserve_ms)
        result = protocol.parse_acquire(self._call("acquire", call.script, call.args, deadline=by))
        self._hand_over(result.handoffs)
        if type(result) is not Granted:
            return False
        # A release granted it to us just in time, at a moment we do not
        # know: confirm it, which renews the lease from now.
        return self._attempt(token, 0, deadline=by) == HELD

    def _give_up_quietly(self, token: str) -> None:
        """Leave the queue if Redis can be reached; a grant that raced is released."""
        try:
            if self._give_up(token):
                self.release()
        except (BackendUnavailable, LockError):
            pass  # the entry is dropped once its deadline passes

    def retoken(self, token: str) -> None:
        """Hold under ``token`` from now on, instead of the token it was granted
        under (one round trip).  A re-published parked run, granted under the
        token it parked with, takes a token naming its own worker and process.
        Raises LockLost when the hold had already lapsed."""
        old = self._token
        if old is None:
            raise LockNotOwned(f"cannot retoken {self.noun} {self.name!r}: not acquired", self.key)
        call = protocol.retoken(self.kind, self.keys, old, token)
        if not protocol.parse_retoken(self._call("retoken", call.script, call.args)):
            self.lost = True
            raise LockLost(f"{self.noun} {self.name!r} lapsed before it was retokened", self.key)
        _keeper.keeper().discard(old)
        self._token = token
        self._prepared_release = None
        if self.renew:
            _keeper.keeper().add(self, token)

    def __enter__(self) -> Any:
        if not self.acquire(timeout=self.timeout):
            raise self._timed_out()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
