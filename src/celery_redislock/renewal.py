"""The per-process lease keeper: one thread renews every lease the process holds.

Each tick is one round trip per Redis client, however many leases are held: all
renewals go out as bare EVALSHAs in one non-transactional pipeline.  The tick
is the shortest renewal interval among the held leases (by default a third of
the lease).  The keeper is created lazily and again in a forked child (each
prefork child gets its own; the parent's thread does not survive ``fork``).

A lease that a renewal finds gone is marked lost: its holder sees ``lost``, a
warning is logged, and every listener registered with :func:`add_lost_listener`
is called (the Celery integration turns that into the ``lock_lost`` signal).
When Redis cannot be reached, the keeper keeps trying every second and marks a
lease lost once more than its ttl has passed since the last good renewal.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis.exceptions import NoScriptError, RedisError

from . import scripts

__all__ = ["Renewable", "add_lost_listener", "keeper", "remove_lost_listener"]

logger = logging.getLogger("celery_redislock.renewal")

#: How soon the keeper tries again after Redis could not be reached, in seconds.
ERROR_RETRY = 1.0


class Renewable(Protocol):
    """What the keeper needs of a held lease (a Lock, a semaphore permit, ...)."""

    client: Any
    ttl: float
    renew_interval: float

    @property
    def key(self) -> str: ...

    def _renew_call(self) -> tuple[Any, list[str], list[Any]]:
        """(script, keys, args) of one renewal; the script returns 1 or 0."""

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
    __slots__ = ("last_ok", "lease", "next_due")

    def __init__(self, lease: Renewable) -> None:
        self.lease = lease
        self.last_ok = time.monotonic()
        self.next_due = self.last_ok + lease.renew_interval


class Keeper:
    """Renews the leases of this process; use :func:`keeper` to get it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._held: dict[int, _Entry] = {}
        self._thread: threading.Thread | None = None
        #: Round trips made by renewals, for tests and stats.
        self.round_trips = 0

    def add(self, lease: Renewable) -> None:
        with self._cond:
            self._held[id(lease)] = _Entry(lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="redislock-renewal", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def discard(self, lease: Renewable) -> None:
        with self._cond:
            self._held.pop(id(lease), None)

    def held(self) -> list[Renewable]:
        with self._cond:
            return [e.lease for e in self._held.values()]

    def _next_due(self) -> float:
        return min(e.next_due for e in self._held.values())

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._held:
                        self._cond.wait()
                        continue
                    delay = self._next_due() - time.monotonic()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                batch = list(self._held.values())
            try:
                self.renew(batch)
            except Exception:  # never let the keeper thread die
                logger.exception("lease renewal failed unexpectedly")
                time.sleep(ERROR_RETRY)

    def renew(self, batch: list[_Entry]) -> None:
        """Renew ``batch`` now: one pipeline, so one round trip, per client."""
        by_client: dict[int, list[_Entry]] = {}
        for entry in batch:
            by_client.setdefault(id(entry.lease.client), []).append(entry)
        for entries in by_client.values():
            self._renew_on(entries[0].lease.client, entries)

    def _renew_on(self, client: Any, entries: list[_Entry]) -> None:
        calls = [e.lease._renew_call() for e in entries]
        started = time.monotonic()
        try:
            results = self._send(client, calls)
            if any(isinstance(r, NoScriptError) for r in results):
                # Redis restarted or was flushed: load the scripts and try once more.
                for script in {id(c[0]): c[0] for c in calls}.values():
                    client.script_load(script.script)
                results = self._send(client, calls)
        except RedisError as exc:
            self._unreachable(entries, exc)
            return
        for entry, result in zip(entries, results):
            if isinstance(result, Exception):
                logger.error("renewing %s failed: %r", entry.lease.key, result)
                self._maybe_expired(entry, f"renewal error {result!r}")
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

    def _unreachable(self, entries: list[_Entry], exc: Exception) -> None:
        logger.error("cannot renew %d lease(s), Redis unreachable: %r", len(entries), exc)
        for entry in entries:
            self._maybe_expired(entry, f"Redis unreachable: {exc!r}")

    def _maybe_expired(self, entry: _Entry, reason: str) -> None:
        # Try again soon rather than a whole interval later.
        entry.next_due = time.monotonic() + min(ERROR_RETRY, entry.lease.renew_interval)
        if time.monotonic() - entry.last_ok >= entry.lease.ttl:
            self._lost(entry, reason + "; the lease has run out since the last renewal")

    def _lost(self, entry: _Entry, reason: str) -> None:
        self.discard(entry.lease)
        entry.lease._mark_lost(reason)


_keeper: Keeper | None = None
_keeper_lock = threading.Lock()


def keeper() -> Keeper:
    """This process's keeper, created on first use and anew after fork."""
    global _keeper
    k = _keeper
    if k is None or k.pid != os.getpid():
        with _keeper_lock:
            if _keeper is None or _keeper.pid != os.getpid():
                _keeper = Keeper()
            k = _keeper
    return k


def _after_fork_in_child() -> None:
    global _keeper, _keeper_lock
    # The parent's thread and its condition do not survive fork; start clean.
    _keeper = None
    _keeper_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
