"""Parked runs the lock store lost: found again from the processes that parked them.

A parked run's message has one copy, in the lock store.  A store that restarts
without persistence (or is flushed, or fails over to a replica that had not
caught up) loses it, and nobody would ever re-publish it.  So each process
remembers the runs it parked (:class:`Memory`, bounded), and its park sweeper
learns, in the round trip it makes anyway, the store's epoch (a key written
once, gone with the data) and its ``run_id`` (new after every restart or
failover).  When either changed, :func:`recover` looks at each remembered run
whose parked entry is no longer in the store:

- its result state is still ``PARKED``: it never started.  It is re-published
  as a fresh arrival (same task id, args and place in line; no park token, so
  it takes a new one: a late delivery of the old hand-over finds its token
  unknown and is dropped, so it cannot run twice);
- it started or ended (STARTED, SUCCESS, FAILURE, REVOKED): forgotten;
- any other state (RETRY: it parked after a retry), or none known
  (``ignore_result``, a result backend other than Redis, a result store that
  lost its data too): reported as possibly lost.

A re-published run that claimed its entry and still runs shows PARKED unless
the task tracks its start (``task_track_started``): with a store loss at that
moment it is re-published and runs again.  Turn ``task_track_started`` on for
park-policy tasks where that matters.

One ERROR names the runs that may be lost, and the ``parked_lost`` signal
carries them, for an alert.  Between losses, a remembered run whose entry is
gone was claimed by its run and is forgotten (checked every
:data:`PRUNE_INTERVAL` seconds, before a sweep that confirms the store did
not change meanwhile).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

from celery import states

from .. import signals
from ..primitives import Primitive
from .parked_state import PARKED

__all__ = ["MAX_BYTES", "MAX_RUNS", "Memory", "Remembered", "recover"]

logger = logging.getLogger("celery_redislock.park")

#: How many parked runs one process remembers (the oldest go first).
MAX_RUNS = 10_000
#: How many payload bytes one process keeps for them at most.
MAX_BYTES = 32 * 1024 * 1024
#: Seconds between checks that forget runs their re-published run claimed.
PRUNE_INTERVAL = 30.0
#: States that say a run started (or ended): its parked entry was claimed.
_RAN = frozenset({states.STARTED, *states.READY_STATES})
#: Parked entries checked per pipeline.
_CHUNK = 500


class Remembered(NamedTuple):
    """A run this process parked: enough to find its entry and re-publish it."""

    task_id: str
    task_name: str
    noun: str  # what the log calls the primitive: "lock", "semaphore", ...
    name: str
    pmsg: str  # the primitive's parked-payload hash
    inflight: str  # its in-flight set
    payload: bytes


class Memory:
    """The runs one process parked, by park token, oldest first (thread-safe)."""

    def __init__(self, max_runs: int = MAX_RUNS, max_bytes: int = MAX_BYTES) -> None:
        self.max_runs = max_runs
        self.max_bytes = max_bytes
        self.runs: OrderedDict[str, Remembered] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def add(self, token: str, task: Any, task_id: str, prim: Primitive, payload: bytes) -> None:
        run = Remembered(
            task_id, task.name, prim.noun, prim.name, prim.keys.pmsg, prim.keys.inflight, payload
        )
        with self.lock:
            old = self.runs.pop(token, None)
            if old is not None:
                self.bytes -= len(old.payload)
            self.runs[token] = run
            self.bytes += len(payload)
            while self.runs and (len(self.runs) > self.max_runs or self.bytes > self.max_bytes):
                _, dropped = self.runs.popitem(last=False)
                self.bytes -= len(dropped.payload)

    def forget(self, tokens: list[str]) -> None:
        with self.lock:
            for token in tokens:
                run = self.runs.pop(token, None)
                if run is not None:
                    self.bytes -= len(run.payload)

    def snapshot(self) -> list[tuple[str, Remembered]]:
        with self.lock:
            return list(self.runs.items())


_memory = Memory()


def memory() -> Memory:
    """This process's memory of the runs it parked."""
    return _memory


def missing(client: Any, runs: list[tuple[str, Remembered]]) -> list[str]:
    """The tokens of ``runs`` whose parked entry (waiting or in flight) is gone."""
    gone: list[str] = []
    for i in range(0, len(runs), _CHUNK):
        chunk = runs[i : i + _CHUNK]
        pipe = client.pipeline(transaction=False)
        for token, run in chunk:
            pipe.hexists(run.pmsg, token)
            pipe.zscore(run.inflight, token)
        found = pipe.execute()
        for j, (token, _run) in enumerate(chunk):
            if not found[2 * j] and found[2 * j + 1] is None:
                gone.append(token)
    return gone


def state_of(app: Any, run: Remembered) -> Optional[str]:
    """The run's result state, or None when the result store cannot say."""
    task = app.tasks.get(run.task_name)
    if task is None or task.ignore_result:
        return None
    try:
        state: str = task.backend.get_state(run.task_id)
    except Exception as exc:
        logger.warning("could not read the state of parked run %s: %r", run.task_id, exc)
        return None
    return None if state == states.PENDING else state


def recover(
    app: Any,
    client: Any,
    why: str,
    republish: Callable[[Any, bytes], None],
    mem: Optional[Memory] = None,
) -> tuple[int, list[str]]:
    """Re-publish (with ``republish(app, payload)``) the remembered runs the
    store lost; returns (how many were re-published, possibly lost task ids)."""
    mem = mem or _memory
    runs = dict(mem.snapshot())
    if not runs:
        return 0, []
    gone = missing(client, list(runs.items()))
    republished = 0
    lost: list[str] = []
    done: list[str] = []
    for token in gone:
        run = runs[token]
        state = state_of(app, run)
        if state == PARKED:
            try:
                republish(app, run.payload)
            except Exception:
                logger.exception("could not re-publish parked run %s", run.task_id)
                lost.append(run.task_id)
            else:
                republished += 1
                logger.warning(
                    "parked run %s[%s] (%s %r) was lost by the lock store; re-published",
                    run.task_name,
                    run.task_id,
                    run.noun,
                    run.name,
                )
        elif state not in _RAN:
            lost.append(run.task_id)
        done.append(token)
    mem.forget(done)
    if lost:
        logger.error(
            "the lock store %s: %d parked run(s) may be lost, their state unknown "
            "(ignore_result, no Redis result backend, or parked after a retry): %s",
            why,
            len(lost),
            ", ".join(lost),
        )
    if signals.parked_lost.receivers:
        signals.parked_lost.send(sender=app, reason=why, republished=republished, lost=lost)
    return republished, lost


class Watch:
    """What one sweeper knows of the store: its epoch and run_id, and when it
    last forgot claimed runs."""

    def __init__(self) -> None:
        self.seen: Optional[tuple[str, str]] = None
        self.pruned = time.monotonic()
        self.prune_due = False

    def before_sweep(self, client: Any, mem: Optional[Memory] = None) -> list[str]:
        """Every PRUNE_INTERVAL, the remembered tokens whose entries are gone
        now (read before the sweep's round trip; see :meth:`after_sweep`)."""
        mem = mem or _memory
        if time.monotonic() - self.pruned < PRUNE_INTERVAL or not mem.runs:
            return []
        self.pruned = time.monotonic()
        return missing(client, mem.snapshot())

    def after_sweep(self, epoch: str, run_id: str) -> Optional[str]:
        """Why the store may have lost data since the last sweep, or None."""
        seen, self.seen = self.seen, (epoch, run_id)
        if seen is None or seen == (epoch, run_id):
            return None
        if seen[0] != epoch:
            return "lost its data (a restart without persistence, or a flush)"
        return "restarted or failed over (writes not yet persisted or replicated are lost)"
