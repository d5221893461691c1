"""Ending a hold (``release``, ``release_async``) and extending one (``extend``).

A release is one script call that also hands over to the next in line.  Its
call is built and packed when ``acquire()`` starts (:meth:`Releasing._release_call`),
so a release sends it at once: the steps between a release call and its
send add to every hand-over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .. import _validate, transport
from ..exceptions import BackendUnavailable, LockLost, LockNotOwned
from . import _errors, _keeper, _replicas, protocol, scripts
from ._core import Core

if TYPE_CHECKING:
    from .unique import Claim

__all__ = ["Release", "Releasing"]


class Releasing(Core):
    """A primitive's release and extension (see :class:`._primitive.Primitive`)."""

    #: (token, reserve_ms, claim, args, packed call) of the release of the latest acquire.
    _prepared_release: Optional[tuple[str, int, Optional[Claim], list[Any], Any]] = None

    def release(self) -> None:
        """Release and hand over to the next in line (one round trip).

        Raises LockNotOwned when this object does not hold it, and LockLost
        when it did but its lease ran out (whoever holds it now is untouched).
        """
        token, fence = self._release_begin()
        args, packed = self._release_call(token)
        sends: list[int] = []
        try:
            reply = self._call(
                "release",
                self.kind.scripts.release,
                args,
                packed=packed,
                sends=sends,
                replicas=self.replicas,
            )
            if self.replicas is not None:
                reply = _replicas.shortfall(self, reply, "release")
        except BackendUnavailable:
            # Still ours as far as we know (no longer renewed): release() may be
            # called again; otherwise the lease runs out by itself.
            self._token, self.fence = token, fence
            raise
        finally:
            _keeper.keeper().discard(token)
        # Sent more than once (the client's retry policy, after a connection
        # error): an earlier send may have released it already.
        self._released(protocol.parse_release(reply), fence, resent=len(sends) > 1)

    def release_async(self) -> Release:
        """Send the release now; :meth:`Release.wait` later says how it went.

        The lock is free (or handed over) as soon as Redis reads the command;
        only learning the outcome waits.  Still one round trip.
        """
        if self.replicas is not None:  # it waits for the replicas: done now
            fence = self.fence
            self.release()
            return Release(self, transport.Reply.done(1), [], fence)
        token, fence = self._release_begin()
        args, packed = self._release_call(token)
        try:
            reply = transport.call_soon(
                self.client,
                scripts.get(self.kind.scripts.release),
                self._keyblock(),
                args,
                packed=packed,
            )
        except transport.UNREACHABLE as exc:
            self._token, self.fence = token, fence  # as release() leaves it
            raise _errors.unreachable("release", self.key, exc) from exc
        finally:
            _keeper.keeper().discard(token)
        return Release(self, reply, args, fence)

    def _release_args(self, token: str) -> list[Any]:
        return protocol.release_args(
            self.keys, token, self._keep_ms, reserve_ms=self.reserve_ms, claim=self.claim
        )

    def _release_call(self, token: str) -> tuple[list[Any], Any]:
        """The release of ``token``'s hold: its arguments, and the call packed.

        Made when ``acquire()`` starts, so that a release sends it at once:
        the steps between the release call and its send add to a hand-over,
        and code that has waited a while runs several times slower than in
        a tight loop.
        """
        made = self._prepared_release
        if (
            made is not None
            and made[0] == token
            and made[1] == self.reserve_ms
            and made[2] is self.claim
        ):
            return made[3], made[4]
        args = self._release_args(token)
        script = scripts.get(self.kind.scripts.release)
        packed = transport.packed_call(self.client, script, self._keyblock(), args)
        self._prepared_release = (token, self.reserve_ms, self.claim, args, packed)
        return args, packed

    def _release_begin(self) -> tuple[str, Optional[int]]:
        """The token and fence of the hold being released, which is no longer
        this object's; the caller discards its renewal once the release is sent."""
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot release {self.noun} {self.name!r}: not acquired", self.key)
        self._token = None  # (first: the keeper takes no lease noted under it after this)
        fence, self.fence = self.fence, None
        return token, fence

    def _released(
        self, released: protocol.Released, fence: Optional[int], *, resent: bool = False
    ) -> None:
        if not released.held:
            if resent and self._no_grant_since(fence):
                # The first send may have run (its reply lost) and this one
                # found nothing to release; either way nobody was granted it
                # after us (the fence is still ours), so no one overlapped.
                return
            raise self._lost_before_release(fence)
        self._hand_over(released.handoffs)

    def _no_grant_since(self, fence: Optional[int]) -> bool:
        """Whether the name's last grant is still the one of ``fence`` (a
        restart without persistence, or a newer grant, says no)."""
        try:
            last = self._redis("release", self.client.get, self.keys.fence)
        except BackendUnavailable:
            return False
        return last is not None and fence is not None and int(last) == fence

    def extend(self, ttl: Optional[float] = None) -> None:
        """Reset the lease to ``ttl`` seconds (default: the primitive's ttl) from now."""
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot extend {self.noun} {self.name!r}: not acquired", self.key)
        seconds = self.ttl if ttl is None else _validate.check_seconds(ttl, "extend ttl")
        call, block = self._renewal(token, seconds)
        reply = self._call("extend", call.script, call.args, block=block, replicas=self.replicas)
        if self.replicas is not None:
            reply = _replicas.shortfall(self, reply, "extend")
        if not protocol.parse_extend(reply):
            self._token = None
            _keeper.keeper().discard(token)
            self._mark_lost("extend found the lease gone")
            raise LockLost(
                f"cannot extend {self.noun} {self.name!r}: its lease had expired", self.key
            )


class Release:
    """A release sent by :meth:`Releasing.release_async`; :meth:`wait` reads its outcome."""

    __slots__ = ("_args", "_fence", "_prim", "_reply")

    def __init__(
        self, prim: Releasing, reply: transport.Reply, args: list[Any], fence: Optional[int]
    ) -> None:
        self._prim = prim
        self._reply = reply
        self._args = args
        self._fence = fence

    def wait(self) -> None:
        """Return once released; raise LockLost (the lease had run out) or
        BackendUnavailable (the outcome could not be learnt: the lock frees
        when its lease ends)."""
        prim = self._prim
        resent = False
        try:
            reply = self._reply.get()
        except transport.ReplyLost:
            # Sent, then the connection broke: it may not have run.  Once more
            # on a fresh connection (finding it released, if the first ran).
            resent = True
            reply = prim._call("release", prim.kind.scripts.release, self._args)
        except transport.UNREACHABLE as exc:
            raise _errors.unreachable("release", prim.key, exc) from exc
        prim._released(protocol.parse_release(reply), self._fence, resent=resent)
