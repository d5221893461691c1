"""The asyncio driver of the lock protocol: acquire-or-wait, release, extend.

It sends the calls :mod:`celery_redislock.primitives.protocol` builds, to
the same keys with the same scripts as the sync primitives, and acts on the
replies the protocol parses, in the same steps as the sync driver:

- ``acquire`` is one script call.  Contended and blocking, the script has
  queued the caller (FIFO) and returned the holder's remaining lease; the
  caller then waits on its wake list (BLPOP, :mod:`.waits`), which a release
  pushes the fence to when it hands over.  The wait is bounded by the
  holder's lease: a crashed holder costs at most that, after which the
  caller asks again, keeping its place.  Giving up sends a cancel, which also
  catches a grant that raced with the timeout.
- ``release`` is one script call that also hands over to the next in line.
- While held, the event loop's renewal task (:mod:`.renewal`) renews the lease.

Cancellation leaves nothing behind: a cancelled ``acquire`` leaves the
queue (a grant that raced with the cancellation is released), and a
cancelled ``release`` still releases (:mod:`.cancellation`).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable
from typing import Any, Optional, Union

from redis.exceptions import ResponseError

from .. import _validate
from ..exceptions import (
    BackendUnavailable,
    ConfigurationError,
    LockError,
    LockLost,
    LockNotOwned,
)
from ..primitives import protocol
from ..primitives.failures import too_old, unreachable
from ..primitives.keys import LockKeys, MultiKeys
from ..primitives.protocol import Call, Granted, Handoff, Queued
from ..primitives.state import HoldState
from ..primitives.tokens import new_token
from ..transport import UNREACHABLE, refused_as_too_old
from . import calls, renewal
from .cancellation import cancel_requested, complete, finish_after_cancel
from .waits import wait_for_grant

__all__ = ["Primitive"]


class Primitive(HoldState):
    """Base of the asyncio Lock, Semaphore and the sides of ReadWriteLock: a
    :class:`~celery_redislock.primitives.state.HoldState` with this driver's calls."""

    keys: Union[LockKeys, MultiKeys]  # set by the subclass

    def __init__(self, client: Any, name: str, ttl: float = 30.0, **options: Any) -> None:
        super().__init__(client, name, ttl, **options)
        if self.replicas is not None:
            raise ConfigurationError(
                f"wait_replicas of {self.noun} {name!r}: the asyncio primitives do not wait "
                f"for replicas; leave it 0, or use the sync primitives, "
                f"got {options.get('wait_replicas')!r}"
            )
        #: Local time the lease ends by, at the earliest, as far as this object knows.
        self._lease_until = 0.0
        self._renewer: Optional[renewal.Renewer] = None

    def _acquire_options(self) -> dict[str, Any]:
        """Keyword arguments of the acquire call (mode and limit, but for a lock)."""
        return {} if self.mode is None else {"mode": self.mode, "limit": self.limit}

    def __repr__(self) -> str:
        state = f"held fence={self.fence}" if self._token else "not held"
        return f"<{type(self).__name__} {self.name!r} {state} (asyncio)>"

    async def _call(self, op: str, call: Call, deadline: Optional[float] = None) -> Any:
        """One script call on the primitive's keys: one round trip."""
        try:
            return await calls.run(self.client, call, deadline)
        except UNREACHABLE as exc:
            raise unreachable(op, self.key, exc) from exc
        except ResponseError as exc:
            if refused_as_too_old(exc):
                raise too_old(op, self.key, exc) from exc
            raise

    async def _redis(self, op: str, command: Awaitable[Any]) -> Any:
        """A plain redis-py command, with "cannot reach Redis" as BackendUnavailable."""
        try:
            return await command
        except UNREACHABLE as exc:
            raise unreachable(op, self.key, exc) from exc

    async def _hand_over(self, handoffs: list[Handoff]) -> None:
        handler = self.on_handoff
        if not handoffs or self._unhandled(handoffs) or handler is None:
            return
        result = handler(handoffs)
        if inspect.isawaitable(result):
            await result

    # -- acquire ---------------------------------------------------------

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take it; True when held, False when not (non-blocking, or timed out).

        ``timeout`` None with ``blocking`` waits forever; with a timeout it
        returns by then, plus one connect timeout at most.
        """
        if timeout is not None:
            if not blocking:
                raise ValueError("can't specify a timeout for a non-blocking acquire")
            _validate.check_seconds(timeout, f"acquire timeout of {self.noun} {self.name!r}")
        if self._token is not None:
            raise LockError(f"{self.noun} {self.name!r} is already held by this object", self.key)
        token = new_token(self.owner)
        pending = cancel_requested()
        try:
            if not blocking:
                got = isinstance(await self._attempt(token, 0), Granted)
            else:
                got = await wait_for_grant(self, token, timeout)
            if cancel_requested() > pending:
                # Cancelled meanwhile, and the cancellation lost on its way
                # (see cancellation.py): it is answered all the same.
                raise asyncio.CancelledError()
            return got
        except BackendUnavailable:
            raise  # (Redis unreachable: a place in line lapses by itself)
        except BaseException:
            # Cancelled (or an on_handoff failed): leave no place in line, and
            # release a grant the caller will not know of.
            await complete(self._abandon(token))
            raise

    async def _attempt(
        self, token: str, wait_ms: int, deadline: Optional[float] = None
    ) -> protocol.AcquireResult:
        """One acquire call (queueing for ``wait_ms``; 0: not queueing)."""
        call = protocol.acquire(
            self.kind,
            self.keys,
            token,
            protocol.to_ms(self.ttl),
            wait_ms,
            self._keep_ms,
            **self._acquire_options(),
        )
        sent = time.monotonic()
        result = protocol.parse_acquire(await self._call("acquire", call, deadline))
        if isinstance(result, Granted):
            self._granted(token, result.fence, sent)
        elif isinstance(result, Queued):
            self._queued(result, sent)
        await self._hand_over(result.handoffs)
        return result

    def _granted(self, token: str, fence: int, start: float) -> None:
        """Held under ``token``; ``start`` is the local time the lease began at
        the earliest (renewal and the lost timer count from there)."""
        self._hold(token, fence, start)
        self._lease_until = start + self.ttl
        if self.renew:
            self._renewer = renewal.renewer_for(self.client)
            self._renewer.add(self, token)

    async def _give_up(self, token: str) -> bool:
        """Leave the queue, within one connect timeout; True when a release
        granted it just before (confirmed)."""
        by = time.monotonic() + calls.connect_timeout(self.client)
        call = protocol.cancel(self.kind, self.keys, token, self._keep_ms, self.reserve_ms)
        result = protocol.parse_acquire(await self._call("acquire", call, by))
        await self._hand_over(result.handoffs)
        if not isinstance(result, Granted):
            return False
        # Granted just in time, at a moment we do not know: confirm it, which
        # renews the lease from now.
        return isinstance(await self._attempt(token, 0, by), Granted)

    async def _abandon(self, token: str) -> None:
        """Undo an acquire that will not return True: leave the queue, and
        release a grant (recorded, or found by the cancel call)."""
        try:
            if self._token != token and not await self._give_up(token):
                return
            await self._release(token)
        except (BackendUnavailable, LockError):
            pass  # a place in line is dropped once its wait is over; a lease runs out

    # -- release / extend ------------------------------------------------------

    async def release(self) -> None:
        """Release and hand over to the next in line (one round trip).

        Raises LockNotOwned when this object does not hold it, and LockLost
        when it did but its lease ran out (whoever holds it now is untouched).
        A cancelled release still releases: the cancellation is raised once
        the release is over.
        """
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot release {self.noun} {self.name!r}: not acquired", self.key)
        try:
            await self._release(token)
        except asyncio.CancelledError:
            if self._token == token:
                # Cut short before its reply was read: the call went out (and
                # may have run) or not.  Sent again, to the end.
                await finish_after_cancel(self._release(token, resent=True))
            raise

    async def _release(self, token: str, resent: bool = False) -> None:
        """The release call; ``resent``: a first one was cut short (it may have run)."""
        fence = self.fence
        if self._renewer is not None:
            self._renewer.discard(token)  # (first: no renewal goes out after the release)
        # Still held until the reply says otherwise: a release that fails
        # (BackendUnavailable) may be called again; else the lease runs out.
        call = protocol.release(
            self.kind, self.keys, token, self._keep_ms, reserve_ms=self.reserve_ms
        )
        released = protocol.parse_release(await self._call("release", call))
        if self._token == token:
            self._token = self.fence = None
        if not released.held:
            # Redis found nothing to release.  The client's retry policy may
            # have sent the call twice (the first ran, its reply was lost):
            # while the lease should still be alive and nobody was granted
            # the name after us (the fence is still ours), nobody overlapped.
            # Sent again after a cut-short first call, with the lease alive
            # (by the local bound, which Redis's outlasts): only that first
            # call can have released it, handing over maybe (a new fence).
            alive = not self.lost and time.monotonic() < self._lease_until
            if alive and (resent or await self._no_grant_since(fence)):
                return
            raise self._lost_before_release(fence)
        if released.handoffs:
            # (Released: the hand-over must not be cut short either.)
            await complete(self._hand_over(released.handoffs))

    async def _no_grant_since(self, fence: Optional[int]) -> bool:
        try:
            last = await self._redis("release", self.client.get(self.keys.fence))
        except BackendUnavailable:
            return False
        return last is not None and fence is not None and int(last) == fence

    async def extend(self, ttl: Optional[float] = None) -> None:
        """Reset the lease to ``ttl`` seconds (default: the primitive's ttl) from now."""
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot extend {self.noun} {self.name!r}: not acquired", self.key)
        seconds = float(_validate.check_seconds(ttl, "extend ttl", optional=True) or self.ttl)
        sent = time.monotonic()
        call = protocol.extend(self.kind, self.keys, token, protocol.to_ms(seconds))
        if int(await self._call("extend", call)):
            self._lease_until = sent + seconds
            return
        if self._token == token:
            self._token = None
        if self._renewer is not None:
            self._renewer.discard(token)
        self._mark_lost("extend found the lease gone")
        raise LockLost(f"cannot extend {self.noun} {self.name!r}: its lease had expired", self.key)

    # -- context manager -----------------------------------------------------

    async def __aenter__(self) -> Any:
        if not await self.acquire(timeout=self.timeout):
            raise self._timed_out()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()

    # -- renewal hooks (the renewal task calls these) ----------------------------

    def _renew_call(self, token: str) -> Call:
        return protocol.extend(self.kind, self.keys, token, protocol.to_ms(self.ttl))

    def _renewed(self, sent: float) -> None:
        self._lease_until = sent + self.ttl
