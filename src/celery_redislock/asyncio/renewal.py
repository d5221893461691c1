"""Lease renewal for the asyncio primitives: one renewer per event loop and client.

Each client's leases held in one event loop are renewed by one renewer, which
sends every renewal of a round together: one pipeline, so one round trip
per round (per node on a cluster), however many leases are held.  A round
starts when the first lease is due (its ``renew_interval`` after its last
good renewal) and renews them all.  A lease is marked lost when a renewal
finds it gone, or when its ttl has passed since the send of its last good
renewal, whether or not that renewal's reply ever came (a renewal is not
awaited past the first lease's end).  Lost means what it means for the sync
primitives: the holder sees ``lost``, its ``on_lost`` is called, and the
``lock_lost`` listeners are told (:func:`celery_redislock.primitives.losses.notify_lost`).

Leases are held weakly: a primitive dropped without ``release()`` stops
being renewed and its lease runs out.

No task waits between rounds: a timer of the event loop (``call_later``)
wakes the renewer when the first lease is due, and a round runs in a task of
its own.  A grant adds its lease and moves the timer only when that lease is
due before it, so a short hold costs no task, no timer and no wake-up; a
timer that finds nothing held lets the renewer go.  A timer left when the
event loop closes is dropped with it.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from typing import Any, Optional

from ..primitives.losses import ERROR_RETRY, logger, notify_lost, retry_soon
from ..transport import DeadlineExceeded
from . import calls

__all__ = ["ERROR_RETRY", "Renewer", "notify_lost", "renewer_for", "renewers"]


class _Entry:
    """One lease being kept alive: its renewal call, and the lease, weakly."""

    __slots__ = ("call", "interval", "last_ok", "next_due", "ref", "token", "ttl")

    def __init__(self, lease: Any, token: str) -> None:
        self.ref = weakref.ref(lease)
        self.token = token
        self.ttl: float = lease.ttl
        self.interval: float = lease.renew_interval
        self.call = lease._renew_call(token)
        # The lease began when it was granted, not when this task heard.
        self.last_ok: float = lease.granted_at or time.monotonic()
        self.next_due = self.last_ok + self.interval


class Renewer:
    """Renews the leases of one client in one event loop; get it with :func:`renewer_for`."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.entries: dict[str, _Entry] = {}
        #: The timer that wakes the renewer next, and when (time.monotonic()).
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_at = math.inf
        #: The round in flight, if any.
        self._round: Optional[asyncio.Task[None]] = None
        #: Renewal rounds sent (one round trip per server each), for tests and stats.
        self.round_trips = 0

    @property
    def running(self) -> bool:
        """Whether it has leases to renew, or a round in flight."""
        return bool(self.entries) or self._round is not None

    def add(self, lease: Any, token: str) -> None:
        """Keep ``lease`` (held under ``token``) renewed until :meth:`discard`."""
        entry = self.entries[token] = _Entry(lease, token)
        _registry(self.loop)[id(self.client)] = self
        if self._round is None:  # (else the round's end sets the timer)
            self._wake_at(entry.next_due)  # (due before its lease would be lost)

    def discard(self, token: str) -> None:
        # (No wake-up: the timer finds the renewer idle, then lets it go.)
        self.entries.pop(token, None)

    def held(self) -> list[Any]:
        """The leases being renewed (those still referenced elsewhere)."""
        leases = [entry.ref() for entry in self.entries.values()]
        return [lease for lease in leases if lease is not None]

    def _wake_at(self, at: float) -> None:
        """Have the timer fire by ``at`` (time.monotonic())."""
        if at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_later(max(0.0, at - time.monotonic()), self._tick)

    def _tick(self) -> None:
        """The timer fired: drop what is gone, mark what ran out, start a
        round when one is due, else set the timer for the next."""
        self._timer, self._timer_at = None, math.inf
        try:
            now = time.monotonic()
            for token in [t for t, e in self.entries.items() if e.ref() is None]:
                del self.entries[token]  # dropped without release: let it run out
            for entry in [e for e in self.entries.values() if now - e.last_ok >= e.ttl]:
                self._lost(
                    entry,
                    f"no renewal succeeded within the lease ({entry.ttl:g} s): the event "
                    "loop stalled, or Redis was unreachable",
                )
            if not self.entries:
                registry = _registry(self.loop)
                if registry.get(id(self.client)) is self:
                    del registry[id(self.client)]
                return
            due = min(e.next_due for e in self.entries.values())
            if due <= now:
                self._round = self.loop.create_task(self._run(), name="redislock-renew")
            else:
                self._wake_at(min(due, *(e.last_ok + e.ttl for e in self.entries.values())))
        except Exception:  # a bug must not pass unseen; the next grant sets the timer again
            logger.exception("lease renewal failed unexpectedly")

    async def _run(self) -> None:
        """One round, then the timer for the next (not when cancelled: the
        event loop is closing)."""
        try:
            await self._renew(list(self.entries.values()))
        except Exception:  # as in _tick
            logger.exception("lease renewal failed unexpectedly")
        finally:
            self._round = None
        self._tick()

    async def _renew(self, entries: list[_Entry]) -> None:
        started = time.monotonic()
        self.round_trips += 1
        # Not awaited past the end of the first lease: that one is lost then.
        bound = max(0.001, min(e.last_ok + e.ttl for e in entries) - started)
        try:
            batch = calls.run_batch(self.client, [e.call for e in entries])
            results = await asyncio.wait_for(batch, bound)
        except asyncio.TimeoutError:
            results = [DeadlineExceeded(f"no reply within {bound:.3f} s")] * len(entries)
        failed: list[tuple[_Entry, BaseException]] = []
        for entry, result in zip(entries, results):
            if self.entries.get(entry.token) is not entry:
                continue  # released (or lost) while the renewal was in flight
            if isinstance(result, BaseException):
                failed.append((entry, result))
            elif int(result):
                entry.last_ok = started
                entry.next_due = started + entry.interval
                lease = entry.ref()
                if lease is not None:
                    lease._renewed(started)
            else:
                self._lost(entry, "the lease had expired or was taken over before renewal")
        retry_soon(failed)

    def _lost(self, entry: _Entry, reason: str) -> None:
        if self.entries.get(entry.token) is entry:
            del self.entries[entry.token]
        lease = entry.ref()
        if lease is not None and lease.token == entry.token:
            lease._mark_lost(reason)


#: Event loop -> id(client) -> the renewer of that client's leases in that loop.
_renewers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Renewer]] = (
    weakref.WeakKeyDictionary()
)


def _registry(loop: asyncio.AbstractEventLoop) -> dict[int, Renewer]:
    found = _renewers.get(loop)
    if found is None:
        found = _renewers[loop] = {}
    return found


def renewer_for(client: Any) -> Renewer:
    """The renewer of ``client``'s leases in the running event loop."""
    loop = asyncio.get_running_loop()
    renewer = _registry(loop).get(id(client))
    if renewer is None or renewer.client is not client:
        renewer = Renewer(client, loop)  # (registered when it is given a lease)
    return renewer


def renewers() -> list[Renewer]:
    """The renewers of the running event loop with leases to renew (or a round in flight)."""
    return [r for r in _registry(asyncio.get_running_loop()).values() if r.running]
