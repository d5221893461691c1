"""The machinery every primitive shares: acquire-or-wait, release, renewal, parking.

A subclass names its scripts and keys; this class runs the protocol:

- ``acquire`` sends one script call.  Uncontended, that is the only round
  trip.  Contended and blocking, the script has queued the caller (FIFO) and
  returned the holder's remaining lease; the caller then BLPOPs its own wake
  list, which a release pushes the fence to when it hands over.  The BLPOP is
  bounded by the holder's lease, so a crashed holder costs at most that, after
  which the caller asks again, keeping its place.  Giving up sends a cancel,
  which also catches a grant that raced with the timeout.
- ``release`` is one script call that also hands over to the next in line.
- While held, the per-process keeper (renewal.py) renews the lease.
- Parking (used by LockedTask's ``on_contention="park"``): a contended caller
  leaves a payload in the queue instead of blocking; whichever script call
  later grants it returns the payload, and ``on_parked`` re-publishes it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, ClassVar, Optional, cast

from redis.exceptions import NoScriptError

from . import _common, checkout, renewal, scripts, wire
from ._common import FOREVER_MS, GRACE_MS, UNREACHABLE, call, decode, to_ms
from .exceptions import (
    BackendUnavailable,
    ConfigurationError,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
)

__all__ = ["DEFAULT_PARK_RESERVE", "Parked", "Primitive"]

#: Seconds a granted parked task may take to start before it is re-published.
DEFAULT_PARK_RESERVE = 10.0

#: (token, payload) of a parked task that a script call granted.
Parked = tuple[str, bytes]


def _pairs(items: list[Any]) -> list[Parked]:
    return [(decode(items[i]), items[i + 1]) for i in range(0, len(items) - 1, 2)]


class Primitive:
    """Base of Lock, Semaphore and the sides of ReadWriteLock."""

    kind: str = "lock"
    keys: Any  # a keys.LockKeys or keys.MultiKeys, set by the subclass
    ACQUIRE: ClassVar[str]
    RELEASE: ClassVar[str]
    CANCEL: ClassVar[str]
    EXTEND: ClassVar[str]
    RECOVER: ClassVar[str]

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
        on_parked: Optional[Callable[[list[Parked]], None]] = None,
        park_reserve: float = DEFAULT_PARK_RESERVE,
    ) -> None:
        seconds = _common.is_seconds
        if not (
            seconds(ttl)
            and seconds(park_reserve)
            and (timeout is None or seconds(timeout))
            and (renew_interval is None or (seconds(renew_interval) and renew_interval < ttl))
            and type(name) is str
            and name
            and type(prefix) is str
            and prefix
        ):
            # The full checks, and their messages, only when the quick one fails
            # (or for number subclasses): a task builds a lock per run.
            self._check(name, ttl, timeout, renew_interval, park_reserve, prefix)
        self.client = client
        self.name = name
        self.ttl = float(ttl)
        self.timeout = None if timeout is None else float(timeout)
        self.renew_interval = float(renew_interval) if renew_interval is not None else ttl / 3
        self.renew = renew
        self.owner = owner
        self.on_lost = on_lost
        self.on_parked = on_parked
        self.park_reserve = float(park_reserve)
        self.prefix = prefix
        #: Fencing token of the current hold, or None when not held.
        self.fence: Optional[int] = None
        #: True once renewal (or release) found that the lease ran out while held.
        self.lost = False
        #: A holder's token and remaining lease (ms) seen by the last failed acquire.
        self.holder: Optional[str] = None
        self.holder_ttl_ms: Optional[int] = None
        #: The server's clock (ms) seen by the last acquire attempt that did not get it at once.
        self.server_now_ms = 0
        self._token: Optional[str] = None
        self._block: Optional[wire.KeyBlock] = None

    def _check(
        self,
        name: Any,
        ttl: Any,
        timeout: Any,
        renew_interval: Any,
        park_reserve: Any,
        prefix: Any,
    ) -> None:
        """Raise ConfigurationError naming the first bad argument, if any."""
        what = f"{self.kind} {name!r}"
        _common.check_name(name, f"{self.kind} name")
        ttl = _common.check_seconds(ttl, f"ttl of {what}")
        _common.check_seconds(timeout, f"timeout of {what}", allow_none=True)
        interval = _common.check_seconds(
            renew_interval, f"renew_interval of {what}", allow_none=True
        )
        if interval is not None and interval >= ttl:
            raise ConfigurationError(
                f"renew_interval of {what} must be shorter than its ttl ({ttl}), got {interval!r}"
            )
        _common.check_seconds(park_reserve, f"park_reserve of {what}")
        _common.check_name(prefix, "prefix")

    # -- what subclasses provide ---------------------------------------------

    @property
    def key(self) -> str:
        """The key that exists while the primitive is held (the lease lives there)."""
        raise NotImplementedError

    @property
    def wake_prefix(self) -> str:
        return str(self.keys.wake)

    @property
    def script_keys(self) -> list[str]:
        return list(self.keys.script_keys)

    def _script(self, op: str, script: str, args: list[Any]) -> Any:
        """Run one of the primitive's scripts on its keys: one round trip."""
        try:
            return wire.evalsha(self.client, scripts.get(script), self._keyblock(), args)
        except UNREACHABLE as exc:
            raise _common.unreachable(op, self.key, exc) from exc

    def _keyblock(self) -> wire.KeyBlock:
        block = self._block
        if block is None:
            block = self._block = wire.KeyBlock(self.script_keys)
        return block

    def _extra_args(self) -> list[Any]:
        """ARGV after the common ones of the acquire script."""
        return []

    def __repr__(self) -> str:
        state = f"held fence={self.fence}" if self._token else "not held"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    @property
    def token(self) -> Optional[str]:
        """The owner token of the current hold, or None."""
        return self._token

    # -- acquire ---------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take it; True when held, False when not (non-blocking, or timed out).

        ``timeout`` None with ``blocking`` waits forever.
        """
        if timeout is not None:
            if not blocking:
                raise ValueError("can't specify a timeout for a non-blocking acquire")
            _common.check_seconds(timeout, f"acquire timeout of {self.kind} {self.name!r}")
        token = self._new_token()
        if not blocking:  # one attempt, the common case of a task's lock
            return self._attempt(token, 0) == 1
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        cap = _common.block_cap(self.client)

        def wait_ms() -> int:
            left = deadline - time.monotonic()
            return FOREVER_MS if left == math.inf else max(1, int(left * 1000))

        status = self._attempt(token, wait_ms())
        while status == 0:
            left = deadline - time.monotonic()
            if left <= 0:
                return self._give_up(token)
            # Block until a release hands over, or until the holder's lease
            # would have run out (it may have crashed); then ask again.
            block = min(left, max(self.holder_ttl_ms or 1, 1) / 1000.0 + 0.002)
            if cap is not None:
                block = min(block, cap)
            popped = call(
                "acquire", self.key, wire.blpop, self.client, self.wake_prefix + token, block
            )
            if popped is not None:
                return self._granted(token, int(popped[1]))
            status = self._attempt(token, wait_ms())
        return True

    def acquire_or_park(
        self,
        token: str,
        payload: bytes | str,
        *,
        claim: bool = False,
        order_ms: Optional[float] = None,
    ) -> str:
        """Take it now, or leave ``payload`` parked in the FIFO queue under ``token``.

        Returns ``"held"``, ``"parked"``, or ``"duplicate"`` when ``claim`` is
        set and that parked token's run has already claimed it (a second
        delivery of the same re-published task).  ``order_ms`` places a parked
        entry in line (e.g. its publish time); default: arrival.  One round trip.
        """
        if self._token is not None:
            raise LockError(f"{self.kind} {self.name!r} is already held by this object", self.key)
        status = self._attempt(token, 0, payload, claim, order_ms)
        return {1: "held", 0: "parked", -1: "duplicate"}[status]

    def _new_token(self) -> str:
        if self._token is not None:
            raise LockError(f"{self.kind} {self.name!r} is already held by this object", self.key)
        return _common.new_token(self.owner)

    def _attempt(
        self,
        token: str,
        wait_ms: int,
        payload: bytes | str = "",
        claim: bool = False,
        order_ms: Optional[float] = None,
    ) -> int:
        reply = self._script(
            "acquire", self.ACQUIRE, self._acquire_args(token, wait_ms, payload, claim, order_ms)
        )
        if isinstance(reply, int):  # held, nothing to re-publish: the bare fence
            self._granted(token, reply)
            return 1
        status = int(reply[0])
        if status != -1:
            self.server_now_ms = int(reply[3])
        self._publish(reply[4:])
        if status == 1:
            self._granted(token, int(reply[1]))
        elif status == 0:
            self.holder = decode(reply[2])
            self.holder_ttl_ms = int(reply[1])
        return status

    def _acquire_args(
        self,
        token: str,
        wait_ms: int,
        payload: bytes | str,
        claim: bool,
        order_ms: Optional[float],
    ) -> list[Any]:
        args: list[Any] = [token, to_ms(self.ttl), wait_ms, self.wake_prefix, GRACE_MS]
        extra = self._extra_args()
        if payload or claim or extra:
            # Every argument is encoded on every call; leave out what the
            # script defaults when not parking (the common, hot path).
            args += [
                payload,
                to_ms(self.park_reserve),
                1 if claim else 0,
                "" if order_ms is None else order_ms,
                *extra,
            ]
        return args

    def _release_args(self, token: str) -> list[Any]:
        if self.park_reserve == DEFAULT_PARK_RESERVE:
            return [token, self.wake_prefix]
        return [token, self.wake_prefix, 0, to_ms(self.park_reserve)]

    def _give_up(self, token: str) -> bool:
        reply = self._script(
            "acquire", self.CANCEL, [token, self.wake_prefix, to_ms(self.park_reserve)]
        )
        if isinstance(reply, int):  # a release granted it to us just in time
            return self._granted(token, reply)
        self._publish(reply[4:])
        if int(reply[0]) == 1:
            return self._granted(token, int(reply[1]))
        return False

    def _granted(self, token: str, fence: int) -> bool:
        self._token = token
        self.fence = fence
        self.lost = False
        self.holder = self.holder_ttl_ms = None
        if self.renew:
            renewal.keeper().add(self)
        return True

    def _publish(self, items: list[Any]) -> None:
        if not items:
            return
        parked = _pairs(items)
        if self.on_parked is None:
            renewal.logger.error(
                "%s %r granted %d parked task(s) but has no on_parked to re-publish them; "
                "they are re-published when their reservation lapses",
                self.kind,
                self.name,
                len(parked),
            )
            return
        self.on_parked(parked)

    # -- release / extend / recover --------------------------------------------

    def release(self) -> None:
        """Release and hand over to the next in line (one round trip).

        Raises LockNotOwned when this object does not hold it, and LockLost
        when it did but its lease ran out (whoever holds it now is untouched).
        """
        token, fence = self._release_begin()
        try:
            reply = self._script("release", self.RELEASE, self._release_args(token))
        except BackendUnavailable:
            # Still ours as far as we know (no longer renewed): release() may be
            # called again; otherwise the lease runs out by itself.
            self._token, self.fence = token, fence
            raise
        self._released(reply, fence)

    def release_soon(self, done: Callable[[Optional[Exception]], None]) -> None:
        """Release now, and learn how it went later, without waiting for Redis.

        The release is sent at once (the lock is free, or handed over, as soon
        as Redis reads it); its reply is read when this thread next talks to
        Redis on this client, or at :func:`celery_redislock.wire.settle`.
        ``done`` then gets None, or the error :meth:`release` would have
        raised (LockLost, BackendUnavailable, ...).  Where the reply cannot
        be deferred (see :func:`wire.send_soon`), this is :meth:`release`
        followed by ``done``.  Still one round trip.
        """
        token, fence = self._token, self.fence
        packed, on_reply = self.release_packed(done)  # LockNotOwned unless held
        token = cast(str, token)
        if wire.send_soon(self.client, packed, on_reply):
            return
        try:
            reply = self._script("release", self.RELEASE, self._release_args(token))
        except Exception as exc:
            if isinstance(exc, BackendUnavailable):
                self._token, self.fence = token, fence  # as release() leaves it
            done(exc)
            return
        on_reply(reply)

    def release_packed(
        self, done: Callable[[Optional[Exception]], None]
    ) -> tuple[bytes, Callable[[Any], None]]:
        """Begin a release whose command the caller sends, in a batch of its own.

        Returns the release's command, packed, and the callback its reply must
        go to: the reply itself (an error reply as an exception instance), or
        :class:`checkout.ReplyLost` when it may not have run, in which case the
        callback sends it again.  ``done`` gets what :meth:`release_soon`'s
        would.  The lock is no longer renewed from here on.
        """
        token, fence = self._release_begin()
        args = self._release_args(token)
        script = scripts.get(self.RELEASE)

        def on_reply(reply: Any) -> None:
            try:
                if isinstance(reply, NoScriptError):  # flushed since: load it, send again
                    self.client.script_load(script.script)
                    reply = self._script("release", self.RELEASE, args)
                elif isinstance(reply, checkout.ReplyLost):
                    # Sent, then the connection broke: it may not have run.
                    # Send it again on a fresh connection, as release() does
                    # on a connection found closed (if it had run, this one
                    # finds the lock gone and reports it lost).
                    reply = self._script("release", self.RELEASE, args)
                elif isinstance(reply, Exception):
                    raise reply
                self._released(reply, fence)
            except Exception as exc:
                done(exc)
            else:
                done(None)

        return wire.pack_evalsha(script, self._keyblock(), args), on_reply

    def _release_begin(self) -> tuple[str, Optional[int]]:
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot release {self.kind} {self.name!r}: not acquired", self.key)
        renewal.keeper().discard(self)
        self._token = None
        fence, self.fence = self.fence, None
        return token, fence

    def _released(self, reply: Any, fence: Optional[int]) -> None:
        if isinstance(reply, int):
            return  # released, nothing to re-publish
        if not int(reply[0]):
            self.lost = True
            raise LockLost(
                f"{self.kind} {self.name!r} (fence {fence}) had expired before release; "
                "another owner may have held it since",
                self.key,
            )
        self._publish(reply[2:])

    def extend(self, ttl: Optional[float] = None) -> None:
        """Reset the lease to ``ttl`` seconds (default: the primitive's ttl) from now."""
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot extend {self.kind} {self.name!r}: not acquired", self.key)
        seconds = self.ttl if ttl is None else _common.check_seconds(ttl, "extend ttl")
        ok = call(
            "extend",
            self.key,
            scripts.get(self.EXTEND),
            keys=[self.key],
            args=[token, to_ms(seconds or self.ttl)],
            client=self.client,
        )
        if not int(ok):
            self._token = None
            renewal.keeper().discard(self)
            self._mark_lost("extend found the lease gone")
            raise LockLost(
                f"cannot extend {self.kind} {self.name!r}: its lease had expired", self.key
            )

    def recover(self) -> int:
        """Re-grant parked tasks nobody else would wake (crash recovery); one round trip.

        Returns when (server ms) it should be called again, or -1 when
        nothing is parked any more.
        """
        reply = self._script("recover", self.RECOVER, [self.wake_prefix, to_ms(self.park_reserve)])
        self._publish(reply[1:])
        return int(reply[0])

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

    # -- renewal hooks (see renewal.Renewable) ---------------------------------

    def _renew_call(self, token: str) -> tuple[Any, list[str], list[Any]]:
        return scripts.get(self.EXTEND), [self.key], [token, to_ms(self.ttl)]

    def _mark_lost(self, reason: str) -> None:
        self.lost = True
        if self.on_lost is not None:
            try:
                self.on_lost(self, reason)
            except Exception:
                renewal.logger.exception("on_lost callback of %r failed", self)
        renewal.notify_lost(self, reason)
