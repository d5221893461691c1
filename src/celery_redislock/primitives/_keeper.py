"""The per-process lease keeper: renews every lease the process holds.

Each tick is one round trip per Redis server, however many leases are held:
the renewals of one client go out together (:func:`transport.call_batch`: a
pipeline, or one per cluster node).  The tick is the shortest renewal
interval among the held leases (by default a third of the lease).  The
keeper is created lazily, and anew in a forked child (threads do not survive
``fork``).

Each client is renewed by its own thread, so a client stuck on a partitioned
socket cannot hold up the others; the keeper's own thread only schedules and
keeps time.  A lease is marked lost when a renewal finds it gone, or when
its ttl has passed since the send of its last good renewal, whether or not
that renewal's reply ever came back.  Lost means: the holder sees ``lost``,
a warning is logged, and every listener registered with
:func:`add_lost_listener` is called (the Celery side turns that into the
``lock_lost`` signal).

The keeper holds its leases weakly: a primitive dropped without
``release()`` stops being renewed, and its lease runs out by itself.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from typing import Any, Optional

from .. import transport
from .losses import (
    ERROR_RETRY,
    add_lost_listener,
    logger,
    notify_lost,
    remove_lost_listener,
    retry_soon,
)

__all__ = [
    "Keeper",
    "add_lost_listener",
    "keeper",
    "logger",
    "notify_lost",
    "remove_lost_listener",
]


class _Entry:
    """One hold being kept alive: its renewal call, and the lease, weakly."""

    __slots__ = (
        "call",
        "client",
        "interval",
        "key",
        "last_ok",
        "next_due",
        "ref",
        "replicas",
        "token",
        "ttl",
    )

    def __init__(self, lease: Any, token: str) -> None:
        self.ref = weakref.ref(lease)
        self.token = token
        self.client = lease.client
        self.key: str = lease.key
        self.ttl: float = lease.ttl
        self.interval: float = lease.renew_interval
        self.call = lease._renew_call(token)
        self.replicas: Optional[tuple[int, int]] = getattr(lease, "replicas", None)
        # The lease began when it was granted, not when this process heard.
        self.last_ok = getattr(lease, "granted_at", None) or time.monotonic()
        self.next_due = self.last_ok + self.interval


class _ClientRenewer:
    """The thread renewing the leases of one client, one batch at a time."""

    def __init__(self, keeper: Keeper, client: Any) -> None:
        self.keeper = keeper
        self.client = client
        self.busy = False
        self.batches: queue.SimpleQueue[Optional[list[_Entry]]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="redislock-renew", daemon=True)
        self.thread.start()

    def submit(self, batch: list[_Entry]) -> None:
        self.busy = True
        self.batches.put(batch)

    def stop(self) -> None:
        self.batches.put(None)

    def _run(self) -> None:
        while True:
            batch = self.batches.get()
            if batch is None:
                return
            try:
                self.keeper._renew_on(self.client, batch)
            except Exception:  # never let the thread die
                logger.exception("lease renewal failed unexpectedly")
            finally:
                batch = None  # (not kept while this thread waits for the next)
                self.busy = False
                self.keeper._wake()


class Keeper:
    """Renews the leases of this process; use :func:`keeper` to get it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._held: dict[str, _Entry] = {}  # token -> entry
        #: token -> lease (weakly) noted by add() for the keeper's thread to take.
        self._pending: dict[str, weakref.ref[Any]] = {}
        self._renewers: dict[int, _ClientRenewer] = {}
        self._thread: Optional[threading.Thread] = None
        self._sleeping_until = 0.0  # monotonic time the keeper thread wakes by itself
        self._idle_wait = 1.0  # the last renewal interval seen
        #: Round trips made by renewals (batches sent), for tests and stats.
        self.round_trips = 0

    def add(self, lease: Any, token: str) -> None:
        """Keep ``lease`` (held under ``token``) renewed until :meth:`discard`.

        Cheap for the acquiring thread, which has just been granted: the
        lease is noted, and the keeper's thread makes its entry when it next
        runs, which it does before the first renewal is due.
        """
        self._pending[token] = weakref.ref(lease)
        self._idle_wait = lease.renew_interval
        if self._thread is None:
            self._start()
        # Waking the keeper costs the acquiring thread a context switch;
        # only do it when the keeper would otherwise sleep past this lease's
        # first renewal.  (The keeper notes when it will wake before it looks
        # for new leases a last time, so one noted after that look is seen.)
        first_due = (lease.granted_at or time.monotonic()) + lease.renew_interval
        if first_due < self._sleeping_until:
            self._wake()

    def _start(self) -> None:
        with self._cond:
            if self._thread is None:
                # Started once per process (keeper() makes a new Keeper after
                # fork); _run never lets an error end it.
                self._thread = threading.Thread(
                    target=self._run, name="redislock-keeper", daemon=True
                )
                self._thread.start()

    def _take_pending(self) -> None:
        """Make the entries of the leases noted by :meth:`add` (under ``_cond``);
        one released (or held under another token) since is left out."""
        pending = self._pending
        while pending:
            token, ref = pending.popitem()
            lease = ref()
            if lease is not None and lease.token == token:
                self._held[token] = _Entry(lease, token)

    def discard(self, token: str) -> None:
        with self._cond:
            self._pending.pop(token, None)
            self._held.pop(token, None)

    def held(self) -> list[Any]:
        """The leases being renewed (those still referenced elsewhere)."""
        with self._cond:
            self._take_pending()
            leases = [e.ref() for e in self._held.values()]
        return [lease for lease in leases if lease is not None]

    def tokens(self) -> list[str]:
        with self._cond:
            self._take_pending()
            return list(self._held)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        while True:
            try:
                self._loop()
            except Exception:  # a bug must not end renewal for the whole process
                logger.exception("lease keeper failed unexpectedly; it carries on")
                time.sleep(ERROR_RETRY)

    def _loop(self) -> None:
        while True:
            self._tick()

    def _tick(self) -> None:
        """One round: sleep while nothing is held, then renew what is due and
        mark lost what ran out.  Nothing of a round (its entries, and their
        clients through them) is kept while the keeper sleeps, and renewers
        stop once their client holds no lease: a client whose leases are all
        released, then dropped, can go."""
        with self._cond:
            self._take_pending()
            while not self._held:
                self._stop_renewers(keep=())
                # Idle: sleep one renewal interval at a time rather than
                # until notified, so that a short hold taken and released
                # within it costs no thread wake-up at all (see add()).
                idle = self._idle_wait
                self._sleeping_until = time.monotonic() + idle
                if not self._pending:
                    self._cond.wait(idle)
                self._take_pending()
            self._sleeping_until = 0.0
            expired, until = self._schedule(time.monotonic())
            if until is not None:
                self._sleeping_until = until
                if not self._pending:
                    self._cond.wait(max(0.0, until - time.monotonic()))
                self._sleeping_until = 0.0
        for e in expired:
            self._lost(
                e,
                f"no renewal succeeded within the lease ({e.ttl:g} s): this "
                "process stalled, or Redis was unreachable",
            )

    def _schedule(self, now: float) -> tuple[list[_Entry], Optional[float]]:
        """Send the renewals that are due, each client's to its renewer (under
        ``_cond``).  Returns the entries whose lease ran out (taken out of
        ``_held``), and when to look again: None when that is now."""
        for token in [t for t, e in self._held.items() if e.ref() is None]:
            del self._held[token]  # dropped without release: let it run out
        expired = [e for e in self._held.values() if now - e.last_ok >= e.ttl]
        for e in expired:
            del self._held[e.token]
        groups: dict[int, list[_Entry]] = {}
        for e in self._held.values():
            groups.setdefault(id(e.client), []).append(e)
        due = []
        wake_at = [e.last_ok + e.ttl for e in self._held.values()]
        for key, entries in groups.items():
            renewer = self._renewers.get(key)
            if renewer is not None and renewer.busy:
                continue  # its last round trip has not come back yet
            next_due = min(e.next_due for e in entries)
            if next_due > now:
                wake_at.append(next_due)
                continue
            if renewer is None:
                renewer = self._renewers[key] = _ClientRenewer(self, entries[0].client)
            due.append((renewer, entries))
        for renewer, entries in due:
            renewer.submit(entries)
        self._stop_renewers(keep=groups)
        if expired or due:
            return expired, None
        return expired, min(wake_at, default=now + 1.0)

    def _stop_renewers(self, keep: Any) -> None:
        """Stop the idle renewers of clients not in ``keep`` (no leases left on
        them; under ``_cond``)."""
        for key in [k for k, r in self._renewers.items() if k not in keep and not r.busy]:
            self._renewers.pop(key).stop()

    def _renew_on(self, client: Any, entries: list[_Entry]) -> None:
        started = time.monotonic()
        self.round_trips += 1
        waits = [e.replicas for e in entries if e.replicas is not None]
        # One WAIT per server for the batch: as many replicas as any lease
        # there asks for, as long as any asks to wait.
        replicas = (max(n for n, _ in waits), max(t for _, t in waits)) if waits else None
        results = transport.call_batch(client, [e.call for e in entries], replicas)
        with self._cond:
            current = dict(self._held)
        failed: list[tuple[_Entry, BaseException]] = []
        for entry, result in zip(entries, results):
            if current.get(entry.token) is not entry:
                continue  # released (or re-acquired) while the renewal was in flight
            if isinstance(result, transport.NotReplicated):
                wanted = entry.replicas[0] if entry.replicas is not None else 0
                if result.acked < wanted:
                    failed.append((entry, result))  # not renewed, as far as a failover goes
                    continue
                result = result.reply
            if isinstance(result, BaseException):
                failed.append((entry, result))
            elif result:
                entry.last_ok = started
                entry.next_due = started + entry.interval
            else:
                self._lost(entry, "the lease had expired or was taken over before renewal")
        retry_soon(failed)

    def _lost(self, entry: _Entry, reason: str) -> None:
        with self._cond:
            if self._held.get(entry.token) is entry:
                del self._held[entry.token]
        lease = entry.ref()
        if lease is not None and lease.token == entry.token:
            lease._mark_lost(reason)


_keeper: Optional[Keeper] = None
_keeper_lock = threading.Lock()


def keeper() -> Keeper:
    """This process's keeper, created on first use and anew after fork."""
    global _keeper
    k = _keeper
    if k is None:  # (the fork hook below clears it in a child)
        with _keeper_lock:
            if _keeper is None or _keeper.pid != os.getpid():
                _keeper = Keeper()
            k = _keeper
    return k


def _after_fork_in_child() -> None:
    global _keeper, _keeper_lock
    # The parent's threads and their condition do not survive fork; start clean.
    _keeper = None
    _keeper_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
