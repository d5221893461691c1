"""The protocol every primitive shares: acquire-or-wait, release, renewal.

A subclass names its scripts and keys; this class runs the protocol:

- ``acquire`` sends one script call.  Uncontended, that is the only round
  trip.  Contended and blocking, the script has queued the caller (FIFO) and
  returned the holder's remaining lease; the caller then BLPOPs its own wake
  list, which a release pushes the fence to when it hands over.  The BLPOP is
  bounded by the holder's lease, so a crashed holder costs at most that, after
  which the caller asks again, keeping its place.  Giving up sends a cancel,
  which also catches a grant that raced with the timeout.
- ``release`` is one script call that also hands over to the next in line.
- While held, the per-process keeper (``_keeper.py``) renews the lease.

A queue entry may also be a parked payload instead of a blocked caller (the
Celery side's ``on_contention="park"``, in ``tasks/parking.py``): a script call
that grants such an entry returns its payload, and the primitive hands it to
``on_handoff`` for whoever parked it to re-publish.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from redis.exceptions import ResponseError

from .. import _validate, transport
from ..exceptions import (
    BackendUnavailable,
    BackendUnsupported,
    ConfigurationError,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
)
from . import _keeper, _scripts, keys
from .tokens import new_token

if TYPE_CHECKING:
    from .unique import Claim

__all__ = ["DEFAULT_RESERVE_MS", "GRACE_MS", "Handoff", "Primitive", "Release"]

#: A waiter's place in line is dropped this long after it should have woken.
GRACE_MS = 2000
#: "Wait forever", as sent to the scripts (they compare milliseconds).
FOREVER_MS = 2**40
#: How long a parked entry granted by a script call may take to claim its grant.
DEFAULT_RESERVE_MS = 10000
#: How long a name's fence key is kept after its last grant, in seconds, by default.
DEFAULT_FENCE_RETENTION = 600.0
#: Consecutive failed waits (the wait connection broke) before acquire gives up.
_WAIT_FAILURES = 2
#: How long a grant, renewal or release waits for its replicas by default, ms.
DEFAULT_WAIT_TIMEOUT_MS = 1000
#: A wait that ends this close to the caller's deadline was its last one, s.
_LAST_WAIT = 0.05

#: (token, payload) of a parked entry that a script call granted.
Handoff = tuple[str, bytes]


def to_ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def decode(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def unreachable(op: str, key: str, exc: BaseException) -> BackendUnavailable:
    error = BackendUnavailable(f"Redis unreachable during {op} of {key!r}: {exc}")
    error.__cause__ = exc
    return error


def too_old(op: str, key: str, exc: BaseException) -> BackendUnsupported:
    error = BackendUnsupported(
        f"Redis refused the {op} script of {key!r} as a syntax error, as a server before "
        f"Redis 6.2 refuses its SET ... GET: celery_redislock needs Redis 6.2 or later ({exc})"
    )
    error.__cause__ = exc
    return error


class Primitive:
    """Base of Lock, Semaphore and the sides of ReadWriteLock."""

    kind: str = "lock"
    keys: Any  # a keys.LockKeys or keys.MultiKeys, set by the subclass
    ACQUIRE: ClassVar[str]
    RELEASE: ClassVar[str]
    CANCEL: ClassVar[str]
    EXTEND: ClassVar[str]

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
        fence_retention: float = DEFAULT_FENCE_RETENTION,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        seconds = _validate.is_seconds
        if not (
            seconds(ttl)
            and seconds(fence_retention)
            and (timeout is None or seconds(timeout))
            and (renew_interval is None or (seconds(renew_interval) and renew_interval < ttl))
            and type(name) is str
            and name
            and type(prefix) is str
            and prefix
        ):
            # The full checks, and their messages, only when the quick one fails
            # (or for number subclasses): a task builds a primitive per run.
            self._check(name, ttl, timeout, renew_interval, prefix, fence_retention)
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
        if wait_replicas or wait_timeout_ms != DEFAULT_WAIT_TIMEOUT_MS:
            what = f"{self.kind} {name!r}"
            _validate.check_count(wait_replicas, f"wait_replicas of {what}", minimum=0)
            _validate.check_count(wait_timeout_ms, f"wait_timeout_ms of {what}", minimum=1)
        #: (replicas, timeout ms) every grant, renewal and release waits for
        #: (``WAIT``), or None.
        self.replicas: Optional[tuple[int, int]] = (
            (int(wait_replicas), int(wait_timeout_ms)) if wait_replicas else None
        )
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
        #: (token, reserve_ms, claim, args, packed call) of the release of the latest acquire.
        self._prepared_release: Optional[tuple[str, int, Optional[Claim], list[Any], bytes]] = None
        self._lease_block: Optional[transport.KeyBlock] = None

    def _check(
        self,
        name: Any,
        ttl: Any,
        timeout: Any,
        renew_interval: Any,
        prefix: Any,
        fence_retention: Any = DEFAULT_FENCE_RETENTION,
    ) -> None:
        """Raise ConfigurationError naming the first bad argument, if any."""
        what = f"{self.kind} {name!r}"
        _validate.check_name(name, f"{self.kind} name")
        seconds = _validate.check_seconds(ttl, f"ttl of {what}")
        _validate.check_seconds(timeout, f"timeout of {what}", optional=True)
        interval = _validate.check_seconds(
            renew_interval, f"renew_interval of {what}", optional=True
        )
        if interval is not None and seconds is not None and interval >= seconds:
            raise ConfigurationError(
                f"renew_interval of {what} must be shorter than its ttl ({seconds}), "
                f"got {interval!r}"
            )
        _validate.check_name(prefix, "prefix")
        _validate.check_seconds(fence_retention, f"fence_retention of {what}")

    # -- what subclasses provide ---------------------------------------------

    @property
    def key(self) -> str:
        """The key that exists while the primitive is held (the lease lives there)."""
        raise NotImplementedError

    def _extra_args(self) -> list[Any]:
        """ARGV after the park arguments of the acquire script (mode, limit)."""
        return []

    def _lease_keys(self) -> list[str]:
        """The keys the renewal script touches (the lease lives in the first)."""
        return [self.key]

    # -- plumbing --------------------------------------------------------------

    @property
    def token(self) -> Optional[str]:
        """The owner token of the current hold, or None."""
        return self._token

    def __repr__(self) -> str:
        state = f"held fence={self.fence}" if self._token else "not held"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    def _keyblock(self) -> transport.KeyBlock:
        block = self._block
        if block is None:
            keys = list(self.keys.script_keys)
            if self.claim is not None:
                keys.append(self.claim.key)
            block = self._block = transport.KeyBlock(keys, transport.encoding_of(self.client))
        return block

    def _script(
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
        """Run one of the primitive's scripts on its keys: one round trip.
        With ``replicas``, the reply is ``(reply, replicas that acknowledged)``;
        ``packed``, when given, is the call already packed."""
        try:
            return transport.call(
                self.client,
                _scripts.get(script),
                block or self._keyblock(),
                args,
                packed=packed,
                sends=sends,
                deadline=deadline,
                replicas=replicas,
            )
        except transport.UNREACHABLE as exc:
            raise unreachable(op, self.key, exc) from exc
        except ResponseError as exc:
            if transport.refused_as_too_old(exc):
                raise too_old(op, self.key, exc) from exc
            raise

    def _redis(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A plain redis-py command, with "cannot reach Redis" as BackendUnavailable."""
        try:
            return fn(*args)
        except transport.UNREACHABLE as exc:
            raise unreachable(op, self.key, exc) from exc

    # -- acquire ---------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take it; True when held, False when not (non-blocking, or timed out).

        ``timeout`` None with ``blocking`` waits forever.
        """
        if timeout is not None:
            if not blocking:
                raise ValueError("can't specify a timeout for a non-blocking acquire")
            _validate.check_seconds(timeout, f"acquire timeout of {self.kind} {self.name!r}")
        token = self._new_token()
        self._release_call(token)  # ready for release(), before anything waits
        if not blocking:  # one attempt, the common case of a task's lock
            return self._attempt(token, 0) == 1
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        # With a timeout, every call is bounded by it too (a stalled
        # connection, a reconnect), and giving up by one connect timeout more.
        by = None if timeout is None else deadline

        def attempt() -> int:
            left = deadline - time.monotonic()
            if left <= 0:
                return 0  # out of time: give up below
            wait = FOREVER_MS if left == math.inf else max(1, int(left * 1000))
            try:
                return self._attempt(token, wait, deadline=by)
            except BackendUnavailable as exc:
                if isinstance(exc.__cause__, transport.DeadlineExceeded):
                    return 0  # out of time: give up below
                raise

        status = attempt()
        failures = 0
        while status == 0:
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
                    raise unreachable("acquire", self.key, exc) from exc
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
                fence, start = self._handed_over(popped)
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
        return status == 1

    def _handed_over(self, popped: bytes) -> tuple[int, float]:
        """(fence, local time the lease began at the earliest) of a wake-up.

        The wake-up carries the grant's server time.  The server read its
        clock for the last attempt after this process sent it, so the local
        send time, moved by the server time that passed between that attempt
        and the grant, is never later than the grant: the local lease never
        outlasts the server's.
        """
        fence, _, granted_ms = popped.partition(b":")
        start = self._sent + (int(granted_ms or self._server_ms) - self._server_ms) / 1000.0
        return int(fence), start

    def _new_token(self) -> str:
        if self._token is not None:
            raise LockError(f"{self.kind} {self.name!r} is already held by this object", self.key)
        return new_token(self.owner)

    def _attempt(
        self,
        token: str,
        wait_ms: int,
        payload: bytes | str = "",
        claim: bool = False,
        order_ms: Optional[float] = None,
        deadline: Optional[float] = None,
    ) -> int:
        """One acquire call: 1 held, 0 not (queued or parked), -1 duplicate parked
        run, -2 a claim whose job was superseded (see :attr:`superseded_by`),
        -3 parked but not acknowledged by the replicas (taken back: not parked)."""
        args: list[Any] = [
            token,
            to_ms(self.ttl),
            wait_ms,
            self.keys.wake,
            GRACE_MS,
            self._keep_ms,
        ]
        extra = self._extra_args()
        unique = self.claim
        if payload or claim or extra or unique is not None:
            # Left out when not parking (the common, hot path): the script
            # defaults them.
            args += [
                payload,
                self.reserve_ms,
                1 if claim else 0,
                "" if order_ms is None else order_ms,
                *extra,
            ]
            if unique is not None:
                args.append(unique.arg())
        sent = time.monotonic()
        reply = self._script(
            "acquire", self.ACQUIRE, args, deadline=deadline, replicas=self.replicas
        )
        if self.replicas is not None:
            reply, acked = reply
            if acked < self.replicas[0] and self._held_in(reply):
                self._undo(token, acked)
                self._hand_over(reply[4:] if not isinstance(reply, int) else [])
                return 0
            if acked < self.replicas[0] and payload and int(reply[0]) == 0:
                self.holder, self.holder_ttl_ms = decode(reply[2]), int(reply[1])
                self._hand_over(reply[4:])
                self._unpark(token, acked)
                return -3
        if isinstance(reply, int):  # held, nothing to hand over: the bare fence
            self._granted(token, reply, sent)
            return 1
        status = int(reply[0])
        self._hand_over(reply[4:])
        if status == 1:
            self._granted(token, int(reply[1]), sent)
        elif status == 0:
            self.holder = decode(reply[2])
            self.holder_ttl_ms = int(reply[1])
            self._sent, self._server_ms = sent, int(reply[3])
        elif status == -2:
            self.superseded_by = decode(reply[2])
        return status

    @staticmethod
    def _held_in(reply: Any) -> bool:
        return isinstance(reply, int) or int(reply[0]) == 1

    def _undo(self, token: str, acked: int) -> None:
        """Release a grant the replicas did not acknowledge in time: it counts
        as not acquired (a failover now could give it to someone else too)."""
        _keeper.logger.warning(
            "%s %r: grant acknowledged by %d of %d replicas within %d ms; undone",
            self.kind,
            self.name,
            acked,
            *self.replicas,  # type: ignore[misc]
        )
        self.holder = self.holder_ttl_ms = None
        reply = self._script("release", self.RELEASE, self._release_args(token))
        if not isinstance(reply, int) and int(reply[0]):
            self._hand_over(reply[2:])

    def _unpark(self, token: str, acked: int) -> None:
        """Take back a parked entry the replicas did not acknowledge in time: a
        failover now would lose it, and its message is in no broker any more."""
        _keeper.logger.warning(
            "%s %r: parked entry acknowledged by %d of %d replicas within %d ms; taken back",
            self.kind,
            self.name,
            acked,
            *self.replicas,  # type: ignore[misc]
        )
        k = self.keys
        block = transport.KeyBlock(
            [k.queue, k.meta, k.pmsg, k.inflight], transport.encoding_of(self.client)
        )
        reply = self._script("acquire", "park_drop", [token], block=block)
        if reply and int(reply[1]):  # granted meanwhile: held under its token
            released = self._script("release", self.RELEASE, self._release_args(token))
            if not isinstance(released, int) and int(released[0]):
                self._hand_over(released[2:])

    def _give_up(self, token: str) -> bool:
        """Leave the queue, within one connect timeout."""
        by = time.monotonic() + transport.connect_timeout(self.client)
        reply = self._script(
            "acquire",
            self.CANCEL,
            [token, self.keys.wake, self.reserve_ms, self._keep_ms],
            deadline=by,
        )
        if not isinstance(reply, int):
            self._hand_over(reply[4:])
            if int(reply[0]) != 1:
                return False
        # A release granted it to us just in time, at a moment we do not
        # know: confirm it, which renews the lease from now.
        return self._attempt(token, 0, deadline=by) == 1

    def _give_up_quietly(self, token: str) -> None:
        """Leave the queue if Redis can be reached; a grant that raced is released."""
        try:
            if self._give_up(token):
                self.release()
        except (BackendUnavailable, LockError):
            pass  # the entry is dropped once its deadline passes

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

    def retoken(self, token: str) -> None:
        """Hold under ``token`` from now on, instead of the token it was granted
        under (one round trip).  A re-published parked run, granted under the
        token it parked with, takes a token naming its own worker and process.
        Raises LockLost when the hold had already lapsed."""
        old = self._token
        if old is None:
            raise LockNotOwned(f"cannot retoken {self.kind} {self.name!r}: not acquired", self.key)
        multi = "" if isinstance(self.keys, keys.LockKeys) else "m"
        if not int(self._script("retoken", "retoken", [old, token, multi])):
            self.lost = True
            raise LockLost(f"{self.kind} {self.name!r} lapsed before it was retokened", self.key)
        _keeper.keeper().discard(old)
        self._token = token
        self._prepared_release = None
        if self.renew:
            _keeper.keeper().add(self, token)

    def _hand_over(self, items: list[Any]) -> None:
        if not items:
            return
        handoffs = [(decode(items[i]), items[i + 1]) for i in range(0, len(items) - 1, 2)]
        if self.on_handoff is None:
            _keeper.logger.error(
                "%s %r granted %d parked task(s) but has no on_handoff to re-publish them; "
                "they are re-published when their reservation lapses",
                self.kind,
                self.name,
                len(handoffs),
            )
            return
        self.on_handoff(handoffs)

    # -- release / extend ------------------------------------------------------

    def release(self) -> None:
        """Release and hand over to the next in line (one round trip).

        Raises LockNotOwned when this object does not hold it, and LockLost
        when it did but its lease ran out (whoever holds it now is untouched).
        """
        token, fence = self._release_begin()
        args, packed = self._release_call(token)
        sends: list[int] = []
        try:
            reply = self._script(
                "release", self.RELEASE, args, packed=packed, sends=sends, replicas=self.replicas
            )
            if self.replicas is not None:
                reply = self._replicated(reply, "release")
        except BackendUnavailable:
            # Still ours as far as we know (no longer renewed): release() may be
            # called again; otherwise the lease runs out by itself.
            self._token, self.fence = token, fence
            raise
        finally:
            _keeper.keeper().discard(token)
        # Sent more than once (the client's retry policy, after a connection
        # error): an earlier send may have released it already.
        self._released(reply, fence, resent=len(sends) > 1)

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
                self.client, _scripts.get(self.RELEASE), self._keyblock(), args, packed=packed
            )
        except transport.UNREACHABLE as exc:
            self._token, self.fence = token, fence  # as release() leaves it
            raise unreachable("release", self.key, exc) from exc
        finally:
            _keeper.keeper().discard(token)
        return Release(self, reply, args, fence)

    def _release_args(self, token: str) -> list[Any]:
        claim = self.claim
        if claim is not None:
            return [token, self.keys.wake, self._keep_ms, 0, self.reserve_ms, claim.arg()]
        if self.reserve_ms == DEFAULT_RESERVE_MS:
            return [token, self.keys.wake, self._keep_ms]
        return [token, self.keys.wake, self._keep_ms, 0, self.reserve_ms]

    def _release_call(self, token: str) -> tuple[list[Any], bytes]:
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
        packed = self._keyblock().evalsha(_scripts.get(self.RELEASE).sha, args)
        self._prepared_release = (token, self.reserve_ms, self.claim, args, packed)
        return args, packed

    def _release_begin(self) -> tuple[str, Optional[int]]:
        """The token and fence of the hold being released, which is no longer
        this object's; the caller discards its renewal once the release is sent."""
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot release {self.kind} {self.name!r}: not acquired", self.key)
        self._token = None  # (first: the keeper takes no lease noted under it after this)
        fence, self.fence = self.fence, None
        return token, fence

    def _released(self, reply: Any, fence: Optional[int], *, resent: bool = False) -> None:
        if isinstance(reply, int):
            return  # released, nothing to hand over
        if not int(reply[0]):
            if resent and self._no_grant_since(fence):
                # The first send may have run (its reply lost) and this one
                # found nothing to release; either way nobody was granted it
                # after us (the fence is still ours), so no one overlapped.
                return
            self.lost = True
            raise LockLost(
                f"{self.kind} {self.name!r} (fence {fence}) had expired before release; "
                "another owner may have held it since",
                self.key,
            )
        self._hand_over(reply[2:])

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
            raise LockNotOwned(f"cannot extend {self.kind} {self.name!r}: not acquired", self.key)
        seconds = self.ttl if ttl is None else _validate.check_seconds(ttl, "extend ttl")
        _, block, args = self._renew_call(token, seconds)
        ok = self._script("extend", self.EXTEND, args, block=block, replicas=self.replicas)
        if self.replicas is not None:
            ok = self._replicated(ok, "extend")
        if not int(ok):
            self._token = None
            _keeper.keeper().discard(token)
            self._mark_lost("extend found the lease gone")
            raise LockLost(
                f"cannot extend {self.kind} {self.name!r}: its lease had expired", self.key
            )

    # -- context manager -----------------------------------------------------

    def __enter__(self) -> Any:
        if not self.acquire(timeout=self.timeout):
            raise LockTimeout(
                f"could not acquire {self.kind} {self.name!r} within {self.timeout} s; "
                f"held by {self.holder!r} for another {self.holder_ttl_ms} ms",
                self.key,
                self.holder,
                self.holder_ttl_ms,
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    # -- renewal hooks (the keeper calls these) ----------------------------------

    def _renew_call(
        self, token: str, seconds: Optional[float] = None
    ) -> tuple[Any, transport.KeyBlock, list[Any]]:
        """(script, keys, args) that renews the hold of ``token``; the script returns 1 or 0."""
        block = self._lease_block
        if block is None:
            block = self._lease_block = transport.KeyBlock(
                self._lease_keys(), transport.encoding_of(self.client)
            )
        return _scripts.get(self.EXTEND), block, [token, to_ms(seconds or self.ttl)]

    def _replicated(self, reply_and_acked: tuple[Any, int], op: str) -> Any:
        """The reply of a call that waited for replicas; a shortfall is logged
        (a release or an extension cannot be taken back)."""
        reply, acked = reply_and_acked
        wanted, timeout_ms = self.replicas  # type: ignore[misc]
        if acked < wanted:
            _keeper.logger.warning(
                "%s %r: %s acknowledged by %d of %d replicas within %d ms",
                self.kind,
                self.name,
                op,
                acked,
                wanted,
                timeout_ms,
            )
        return reply

    def _mark_lost(self, reason: str) -> None:
        self.lost = True
        if self.on_lost is not None:
            try:
                self.on_lost(self, reason)
            except Exception:
                _keeper.logger.exception("on_lost callback of %r failed", self)
        _keeper.notify_lost(self, reason)


class Release:
    """A release sent by :meth:`Primitive.release_async`; :meth:`wait` reads its outcome."""

    __slots__ = ("_args", "_fence", "_prim", "_reply")

    def __init__(
        self, prim: Primitive, reply: transport.Reply, args: list[Any], fence: Optional[int]
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
            reply = prim._script("release", prim.RELEASE, self._args)
        except transport.UNREACHABLE as exc:
            raise unreachable("release", prim.key, exc) from exc
        prim._released(reply, self._fence, resent=resent)
