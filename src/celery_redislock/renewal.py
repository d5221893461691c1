"""The per-process lease keeper: renews every lease the process holds.

Each tick is one round trip per Redis client, however many leases are held:
all renewals go out as bare EVALSHAs in one non-transactional pipeline.  The
tick is the shortest renewal interval among the held leases (by default a
third of the lease).  The keeper is created lazily and again in a forked
child (each prefork child gets its own; threads do not survive ``fork``).

Each client is renewed by its own thread, so a client stuck on a partitioned
socket cannot hold up the others; the keeper's own thread only schedules and
keeps time.  A lease is marked lost when a renewal finds it gone, or when
its ttl has passed since the send of its last good renewal, whether or not
that renewal's reply ever came back.  Lost means: the holder sees ``lost``,
a warning is logged, and every listener registered with
:func:`add_lost_listener` is called (the Celery integration turns that into
the ``lock_lost`` signal).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Optional, Protocol

from redis.exceptions import NoScriptError, RedisError

from . import scripts

__all__ = ["Renewable", "add_lost_listener", "keeper", "remove_lost_listener"]

logger = logging.getLogger("celery_redislock.renewal")

#: How soon a client is tried again after a failed renewal, in seconds.
ERROR_RETRY = 1.0


class Renewable(Protocol):
    """What the keeper needs of a held lease (a Lock, a semaphore permit, ...)."""

    client: Any
    ttl: float
    renew_interval: float

    @property
    def key(self) -> str: ...

    @property
    def token(self) -> Optional[str]: ...

    def _renew_call(self, token: str) -> tuple[Any, list[str], list[Any]]:
        """(script, keys, args) renewing the hold of ``token``; the script returns 1 or 0."""

    def _mark_lost(self, reason: str) -> None:
        """Called once when the lease is found lost."""


_listeners: list[Callable[[Any, str], None]] = []


def add_lost_listener(fn: Callable[[Any, str], None]) -> None:
    """Call ``fn(lease, reason)`` whenever a held lease is found lost (idempotent)."""
    if fn not in _listeners:
        _listeners.append(fn)


def remove_lost_listener(fn: Callable[[Any, str], None]) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def notify_lost(lease: Any, reason: str) -> None:
    logger.warning("lock %s lost: %s", lease.key, reason)
    for fn in list(_listeners):
        try:
            fn(lease, reason)
        except Exception:  # a listener must not stop the keeper
            logger.exception("lock_lost listener %r failed", fn)


class _Entry:
    """One hold being kept alive: the lease object and the token it was taken with."""

    __slots__ = ("last_ok", "lease", "next_due", "token")

    def __init__(self, lease: Renewable, token: str) -> None:
        self.lease = lease
        self.token = token
        self.last_ok = time.monotonic()
        self.next_due = self.last_ok + lease.renew_interval


class _ClientRenewer:
    """The thread renewing the leases of one client, one pipeline per batch."""

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
                self.busy = False
                self.keeper._wake()


class Keeper:
    """Renews the leases of this process; use :func:`keeper` to get it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        # A plain lock under the condition: nothing takes it twice, and it is
        # taken twice per hold on the hot path (add, discard).
        self._cond = threading.Condition(threading.Lock())
        self._held: dict[int, _Entry] = {}
        self._renewers: dict[int, _ClientRenewer] = {}
        self._thread: threading.Thread | None = None
        self._sleeping_until = 0.0  # monotonic time the keeper thread wakes by itself
        self._idle_wait = 1.0  # the last renewal interval seen
        #: Round trips made by renewals, for tests and stats.
        self.round_trips = 0

    def add(self, lease: Renewable) -> None:
        token = lease.token
        if token is None:
            return
        entry = _Entry(lease, token)
        with self._cond:
            self._idle_wait = lease.renew_interval
            self._held[id(lease)] = entry
            if self._thread is None:
                # Started once per process (keeper() makes a new Keeper after
                # fork); _run never lets an error end it.
                self._thread = threading.Thread(
                    target=self._run, name="redislock-keeper", daemon=True
                )
                self._thread.start()
            # Waking the keeper costs the acquiring thread a context switch;
            # only do it when the keeper would otherwise sleep past this lease.
            if entry.next_due < self._sleeping_until:
                self._cond.notify()

    def discard(self, lease: Renewable) -> None:
        with self._cond:
            self._held.pop(id(lease), None)

    def held(self) -> list[Renewable]:
        with self._cond:
            return [e.lease for e in self._held.values()]

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
            with self._cond:
                while not self._held:
                    # Idle: sleep one renewal interval at a time rather than
                    # until notified, so that a short hold taken and released
                    # within it costs no thread wake-up at all (see add()).
                    idle = self._idle_wait
                    self._sleeping_until = time.monotonic() + idle
                    self._cond.wait(idle)
                self._sleeping_until = 0.0
                now = time.monotonic()
                expired = [e for e in self._held.values() if now - e.last_ok >= e.lease.ttl]
                for e in expired:
                    self._held.pop(id(e.lease), None)
                groups: dict[int, list[_Entry]] = {}
                for e in self._held.values():
                    groups.setdefault(id(e.lease.client), []).append(e)
                due = []
                wake_at = [e.last_ok + e.lease.ttl for e in self._held.values()]
                for key, entries in groups.items():
                    renewer = self._renewers.get(key)
                    if renewer is not None and renewer.busy:
                        continue  # its last round trip has not come back yet
                    next_due = min(e.next_due for e in entries)
                    if next_due > now:
                        wake_at.append(next_due)
                        continue
                    if renewer is None:
                        renewer = self._renewers[key] = _ClientRenewer(
                            self, entries[0].lease.client
                        )
                    due.append((renewer, entries))
                for renewer, entries in due:
                    renewer.submit(entries)
                for key in [k for k, r in self._renewers.items() if k not in groups and not r.busy]:
                    self._renewers.pop(key).stop()  # no leases left on that client
                if not expired and not due:
                    until = min(wake_at, default=now + 1.0)
                    self._sleeping_until = until
                    self._cond.wait(max(0.0, until - now))
                    self._sleeping_until = 0.0
            for e in expired:
                self._lost(
                    e,
                    f"no renewal succeeded within the lease ({e.lease.ttl:g} s): this "
                    "process stalled, or Redis was unreachable",
                )

    def _renew_on(self, client: Any, entries: list[_Entry]) -> None:
        calls = [e.lease._renew_call(e.token) for e in entries]
        started = time.monotonic()
        try:
            results = self._send(client, calls)
            if any(isinstance(r, NoScriptError) for r in results):
                # Redis restarted or was flushed: load the scripts and try once more.
                for script in {id(c[0]): c[0] for c in calls}.values():
                    client.script_load(script.script)
                results = self._send(client, calls)
        except RedisError as exc:
            logger.error("cannot renew %d lease(s), Redis unreachable: %r", len(entries), exc)
            self._retry_soon(entries)
            return
        with self._cond:
            current = {id(e): e for e in self._held.values()}
        for entry, result in zip(entries, results):
            if current.get(id(entry)) is not entry:
                continue  # released (or re-acquired) while the renewal was in flight
            if isinstance(result, Exception):
                logger.error("renewing %s failed: %r", entry.lease.key, result)
                self._retry_soon([entry])
            elif result:
                entry.last_ok = started
                entry.next_due = started + entry.lease.renew_interval
            else:
                self._lost(entry, "the lease had expired or was taken over before renewal")

    def _send(self, client: Any, calls: list[tuple[Any, list[str], list[Any]]]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for script, keys, args in calls:
            scripts.evalsha_in_pipeline(pipe, script, keys, args)
        self.round_trips += 1
        return list(pipe.execute(raise_on_error=False))

    def _retry_soon(self, entries: list[_Entry]) -> None:
        now = time.monotonic()
        for entry in entries:
            entry.next_due = now + min(ERROR_RETRY, entry.lease.renew_interval)

    def _lost(self, entry: _Entry, reason: str) -> None:
        with self._cond:
            if self._held.get(id(entry.lease)) is entry:
                self._held.pop(id(entry.lease))
            elif entry.lease.token != entry.token:
                return  # that hold is over; a newer one is not ours to condemn
        if entry.lease.token == entry.token:
            entry.lease._mark_lost(reason)


_keeper: Keeper | None = None
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


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
