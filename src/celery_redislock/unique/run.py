"""A unique job's run: its claim on its key, started and ended with its lock.

The publish put the claim in the message (``redislock_unique``: key,
policy, hold).  :class:`UniqueRun` hands it to the run's primitive, whose
acquire script starts it (an until_started or coalesce job stops waiting;
an until_finished one holds the key while it runs) and whose release
script ends it, in the same round trips as the lock.  Only where the lock
cannot carry it (another hash slot of a Redis Cluster) is each step a call
of its own.

A job whose run ends before its body (skipped, failed on contention, revoked
in the queue) lets its key go at once: :meth:`UniqueRun.drop`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from ..exceptions import BackendUnavailable
from ..primitives import Primitive, unique
from ..tasks.messages import DUPLICATE_HEADER, UNIQUE_HEADER, header

__all__ = ["UniqueRun", "claim_in", "duplicate_of"]

logger = logging.getLogger("celery_redislock")


def duplicate_of(request: Any) -> Optional[str]:
    """The job a canvas duplicate was sent for, to end at once; None for a real job."""
    value = header(request, DUPLICATE_HEADER)
    return str(value) if value else None


def claim_in(message: Any, task_id: str, keep_running: bool) -> Optional[unique.Claim]:
    """The claim a message carries (``message``: a run's request, or its headers).

    ``keep_running``: the message stays with the broker until the run ends
    (``acks_late``), so a dead worker's job is delivered again: its
    until_finished key is then kept for its whole hold, not just its lease.
    """
    if isinstance(message, dict):
        raw = message.get(UNIQUE_HEADER) or (message.get("headers") or {}).get(UNIQUE_HEADER)
    else:
        raw = header(message, UNIQUE_HEADER)
    if not raw:
        return None
    key, mode, hold_ms = raw
    if mode == "-":
        return None  # a throttle alone: nothing to start or end
    return unique.Claim(key, task_id, mode, int(hold_ms), int(hold_ms) if keep_running else 0)


class UniqueRun:
    """One run's claim on its job's unique key."""

    __slots__ = ("_dropped", "claim", "client", "folded", "lease")

    def __init__(self, client: Any, claim: unique.Claim) -> None:
        self.client = client
        self.claim = claim
        #: Whether the run's lock scripts carry the claim.
        self.folded = False
        self.lease: Optional[unique.RunLease] = None
        self._dropped = False

    def attach(self, prim: Primitive) -> None:
        """Let ``prim``'s scripts start and end the claim, where they can."""
        if unique.foldable(self.client, self.claim.key, prim.key):
            prim.claim = self.claim
            self.folded = True

    def superseded(self, parked_run: bool) -> Optional[str]:
        """The job that replaced this one, asked on its own where the lock's
        acquire script does not ask: a lock that cannot carry the claim, or a
        re-published parked run (whose script claims its reserved grant first).
        Elsewhere the acquire refuses a superseded job itself (``superseded_by``)."""
        if self.folded and not parked_run:
            return None
        return unique.superseded(self.client, self.claim)

    def started(self, prim: Primitive) -> None:
        """The run holds its lock: its job has started."""
        if not self.folded:
            unique.claim_step(self.client, self.claim, "start", int(prim.ttl * 1000))
        if self.claim.mode == "f":
            self.lease = unique.RunLease(self.client, self.claim, prim.ttl, prim.renew_interval)
            self.lease.granted_at = prim.granted_at
            self.lease.start()

    def parked(self) -> None:
        """The run was parked in Redis: its job keeps waiting, and its key."""
        if not self.folded:
            unique.claim_step(self.client, self.claim, "parked")

    def wait_again(self, prim: Primitive) -> None:
        """The job goes back to wait (a retry, a requeue): its run's end keeps the key."""
        self.claim = dataclasses.replace(self.claim, waits_again=True)
        if self.folded:
            prim.claim = self.claim

    def ended(self) -> None:
        """The run ended; the lock's release script has ended the claim, unless
        it could not carry it."""
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.stop()
        if not self.folded:
            try:
                unique.claim_step(self.client, self.claim, "end")
            except BackendUnavailable as exc:
                logger.error("could not end the claim on unique key %s: %s", self.claim.key, exc)

    def drop(self) -> None:
        """The job ended before its body ran (skipped, failed, revoked): its key
        goes (once: a second call does nothing)."""
        if self._dropped:
            return
        self._dropped = True
        try:
            unique.drop(self.client, self.claim.key, self.claim.job)
        except BackendUnavailable as exc:
            logger.error(
                "could not free unique key %s of job %s; it frees within its hold: %s",
                self.claim.key,
                self.claim.job,
                exc,
            )
