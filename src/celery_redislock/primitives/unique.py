"""Unique keys: a job holds its key from its publish until its run starts or ends.

No Celery here: a job is a string (the task id), a key a hash in Redis (see
``lua/_claim.lua`` for its fields).  :func:`publish` takes a job's key, or
names the job that holds it, in one round trip.  A run carries its
:class:`Claim` into its lock's own scripts (``Primitive.claim``), which
start it as they grant and end it as they release, in the same round trips;
:class:`RunLease` keeps a running until_finished job's hold renewed along
with the process's other leases, so a dead worker's key frees with its lease.

Modes, as the scripts know them: ``'s'`` until started, ``'c'`` coalesce (as
``'s'`` here; the run lock does the rest), ``'f'`` until finished, and
``'-'`` for a throttle alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from redis.cluster import RedisCluster
from redis.crc import key_slot

from .. import transport
from . import _errors, _keeper, scripts
from .protocol import decode, to_ms

__all__ = [
    "Claim",
    "Published",
    "RunLease",
    "State",
    "claim_step",
    "drop",
    "foldable",
    "publish",
    "state",
    "superseded",
]


@dataclass(frozen=True)
class Claim:
    """What a run knows of its job's hold on a unique key."""

    key: str
    job: str
    mode: str
    #: ms the job holds the key when it waits again (a retry, a requeue).
    hold_ms: int
    #: ms a started until_finished job holds it at least (acks_late), besides its lease.
    keep_ms: int = 0
    #: The job waits again after its run (a retry, a requeue): it keeps its key.
    waits_again: bool = False

    def arg(self) -> str:
        """The claim as the scripts read it: ``mode:hold:keep:flags:job``."""
        flags = "k" if self.waits_again else ""
        return f"{self.mode}:{self.hold_ms}:{self.keep_ms}:{flags}:{self.job}"


class Published(NamedTuple):
    """The outcome of :func:`publish`."""

    accepted: bool
    #: Refused: the job holding the key.  Accepted: the waiting job it superseded, or None.
    other: Optional[str] = None
    #: Refused: how much longer the holder holds the key, in ms.
    ttl_ms: Optional[int] = None


class State(NamedTuple):
    """Who holds a unique key now (None and 0 where nobody does)."""

    waiting: Optional[str]
    waiting_ms: int
    running: Optional[str]
    running_ms: int
    throttled_by: Optional[str]
    throttle_ms: int

    @property
    def holder(self) -> Optional[str]:
        """The job a duplicate would be refused for: the waiting one, else the running one."""
        return self.waiting or self.running


def _call(client: Any, op: str, script: str, key: str, args: list[Any]) -> Any:
    block = transport.KeyBlock([key], transport.encoding_of(client))
    return _errors.run(client, op, key, script, block, args)


def publish(
    client: Any,
    key: str,
    job: str,
    mode: str,
    hold_ms: int,
    *,
    replace: bool = False,
    throttle_ms: int = 0,
    again: bool = False,
) -> Published:
    """Take ``key`` for ``job`` (one round trip), or name the job that holds it.

    ``hold_ms``: how long the job holds the key while it waits (its delay
    included); ``replace``: supersede a waiting holder; ``throttle_ms``:
    accept one job per window; ``again``: the same job published once more
    (a retry), which is never refused.
    """
    args = [job, mode, hold_ms, "1" if replace else "0", throttle_ms, "1" if again else "0"]
    reply = _call(client, "publish", "unique_publish", key, args)
    status = int(reply[0])
    if status == 0:
        return Published(False, decode(reply[1]), int(reply[2]))
    return Published(True, decode(reply[1]) if status == 2 else None)


def state(client: Any, key: str) -> State:
    """Who holds ``key`` now (one round trip)."""
    reply = _call(client, "state", "unique_state", key, [])
    jobs = [decode(reply[i]) or None for i in (0, 2, 4)]
    return State(jobs[0], int(reply[1]), jobs[1], int(reply[3]), jobs[2], int(reply[5]))


def drop(client: Any, key: str, job: Optional[str] = None) -> Optional[str]:
    """Let ``key`` go if ``job`` holds it (any job, and the throttle window,
    when None); returns the job that held it."""
    reply = _call(client, "drop", "unique_drop", key, [job or ""])
    return decode(reply) if reply else None


def superseded(client: Any, claim: Claim) -> Optional[str]:
    """The job that superseded ``claim``'s job, or None (one round trip)."""
    reply = _call(client, "acquire", "unique_claim", claim.key, ["check", 0, claim.arg()])
    return decode(reply) if reply else None


def claim_step(client: Any, claim: Claim, step: str, lease_ms: int = 0) -> None:
    """One step of a claim on its own (``start``, ``end`` or ``parked``), for a
    run whose lock cannot carry it (see :func:`foldable`)."""
    _call(client, step, "unique_claim", claim.key, [step, lease_ms, claim.arg()])


def foldable(client: Any, claim_key: str, lock_key: str) -> bool:
    """Whether a lock's scripts can carry the claim: always, but on a Redis
    Cluster where the two keys live in different hash slots."""
    if not isinstance(client, RedisCluster):
        return True
    return bool(key_slot(claim_key.encode()) == key_slot(lock_key.encode()))


class RunLease:
    """The hold of a running until_finished job on its key, renewed by the
    process's keeper with the run's lock (the same round trip per server).

    A run that stops being renewed (its process died) lets the key go when
    the lease, or the claim's ``keep_ms``, runs out.
    """

    def __init__(self, client: Any, claim: Claim, ttl: float, renew_interval: float) -> None:
        self.client = client
        self.claim = claim
        self.key = claim.key
        self.ttl = ttl
        self.renew_interval = renew_interval
        self.replicas = None
        self.granted_at: Optional[float] = time.monotonic()
        self.token: Optional[str] = f"{claim.job}|unique|{id(self):x}"
        self._block = transport.KeyBlock([claim.key], transport.encoding_of(client))

    def start(self) -> None:
        """Keep it renewed from now."""
        if self.token is not None:
            _keeper.keeper().add(self, self.token)

    def stop(self) -> None:
        """Stop renewing (the run ended; its scripts let the key go)."""
        token, self.token = self.token, None
        if token is not None:
            _keeper.keeper().discard(token)

    def _renew_call(self, token: str) -> tuple[Any, transport.KeyBlock, list[Any]]:
        return scripts.get("unique_extend"), self._block, [self.claim.job, to_ms(self.ttl)]

    def _mark_lost(self, reason: str) -> None:
        # Not a lock: nobody is told the lock was lost.  The run goes on; a
        # duplicate may be published meanwhile, which the log says.
        _keeper.logger.warning(
            "unique key %s of job %s no longer held while it runs: %s",
            self.key,
            self.claim.job,
            reason,
        )
