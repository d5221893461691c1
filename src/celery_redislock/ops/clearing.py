"""Clearing what is stuck: free a name with its fence raised; drop or re-publish a parked run.

Freeing goes through the holder's own release script, with the token the
operator was shown, so it frees exactly that hold (never one taken since)
and serves the next in line as the holder's release would.  The fence is
raised first, so every grant after it, and the raised fence itself, is
above the old holder's: a fenced store refuses the old holder's writes, its
renewal finds the lease gone, and its own release raises ``LockLost``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Optional

from celery.backends.base import DisabledBackend

from .. import transport
from ..primitives import bump_fence, keys, protocol, release_token, scripts
from ..primitives import unique as unique_keys
from ..primitives.kinds import Kind as PrimitiveKind
from ..tasks import parking
from ..unique.run import claim_in
from .entries import Entry, Holder, Kind, ParkedRun
from .reading import details, read, scan, text

__all__ = [
    "Dropped",
    "Released",
    "drop_parked",
    "drop_unique_claim",
    "keys_of",
    "mark_dropped",
    "release",
    "republish",
]

#: Re-publishes parked runs a release granted: ``(token, payload)`` pairs.
Republisher = Callable[[list[tuple[str, bytes]]], None]


@dataclasses.dataclass(frozen=True)
class Released:
    """What :func:`release` did: the holds it freed, and the name's new fence
    (None for a unique key, which has none)."""

    kind: Kind
    name: str
    fence: Optional[int]
    freed: tuple[Holder, ...]
    unique_job: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "name": self.name,
            "fence": self.fence,
            "freed": [h.as_dict() for h in self.freed],
            "unique_job": self.unique_job,
        }


@dataclasses.dataclass(frozen=True)
class Dropped:
    """A parked run taken out of its line; ``payload`` is its message."""

    run: ParkedRun
    payload: bytes


def keys_of(entry: Entry) -> Any:
    """The keys of the lock, semaphore or read-write lock ``entry`` lists."""
    return keys.of_kind_at(PrimitiveKind(entry.kind.value), entry.key)


def release(
    client: Any,
    entry: Entry,
    *,
    holder: Optional[str] = None,
    fence_retention: float,
    reserve_ms: int,
    republish: Optional[Republisher] = None,
) -> Released:
    """Free ``entry``'s holds (only the one whose token or task id is
    ``holder``, when given) and raise its fence; a unique key is let go."""
    if entry.kind is Kind.UNIQUE:
        # With ``holder``, only that job lets go (the throttle window stays).
        job = unique_keys.drop(client, f"{entry.key}:unique", holder)
        return Released(entry.kind, entry.name, None, (), job)
    k = keys_of(entry)
    chosen = [h for h in entry.holders if holder is None or holder in (h.token, h.task_id)]
    fence = bump_fence(client, k.fence, fence_retention)
    freed = []
    for h in chosen:
        done, granted = release_token(
            client, k, h.token, fence_retention=fence_retention, reserve_ms=reserve_ms
        )
        if done:
            freed.append(h)
        if granted and republish is not None:
            republish(granted)
        # Without a republisher, a granted parked run is re-published by a
        # worker's sweeper once its reservation lapses.
    return Released(entry.kind, entry.name, fence, tuple(freed))


def _parked_in(client: Any, prefix: str, run_id: str) -> Optional[Entry]:
    """The entry whose line holds parked run ``run_id``: the recovery index's
    names first, then every name with parked runs (SCAN)."""
    members = client.zrange(parking.index_key(prefix), 0, -1)
    candidates: list[tuple[str, Kind]] = []
    for member in members:
        infix, _, name = text(member).partition(":")
        kind = PrimitiveKind.of_index_prefix(infix)
        if kind is not None:
            base = keys.tag(prefix, name)
            candidates.append((base[len(prefix) + 2 : -1], Kind(kind.value)))
    found = scan(client, prefix)
    candidates += [nk for nk, parts in found.items() if "pmsg" in parts]
    for entry in read(client, prefix, dict.fromkeys(candidates)):
        if entry.kind is not Kind.UNIQUE and client.hexists(keys_of(entry).pmsg, run_id):
            return entry
    return None


def drop_parked(
    client: Any,
    prefix: str,
    run_id: str,
    *,
    fence_retention: float,
    reserve_ms: int,
    republish: Optional[Republisher] = None,
) -> Optional[Dropped]:
    """Take parked run ``run_id`` out of its line; None when no line holds it.

    A run already granted (in flight) held the primitive under its token:
    that hold is released, serving the next in line.
    """
    entry = _parked_in(client, prefix, run_id)
    if entry is None:
        return None
    _waiters, runs = details(client, prefix, entry)
    run = next((r for r in runs if r.id == run_id), None)
    k = keys_of(entry)
    call = protocol.park_drop(k, run_id)
    block = transport.KeyBlock(call.keys, transport.encoding_of(client))
    dropped = protocol.parse_park_drop(
        transport.call(client, scripts.get(call.script), block, call.args)
    )
    if dropped is None:
        return None  # claimed by its run meanwhile
    payload, flying = dropped
    if flying:
        _, granted = release_token(
            client, k, run_id, fence_retention=fence_retention, reserve_ms=reserve_ms
        )
        if granted and republish is not None:
            republish(granted)
    if run is None:  # (claimed and parked again between the two reads)
        run = ParkedRun(run_id, entry.name, entry.kind, None, None, None, None, bool(flying))
    return Dropped(run, payload if isinstance(payload, bytes) else payload.encode())


def drop_unique_claim(client: Any, dropped: Dropped) -> Optional[str]:
    """Let go of the unique key that a dropped parked run's job holds (it
    will never run, and would keep its key until the key lapses); the job
    that let go, or None."""
    options = parking.decode(dropped.payload).get("options") or {}
    job = options.get("task_id") or dropped.run.task_id
    claim = claim_in(options, job, False) if job else None
    return None if claim is None else unique_keys.drop(client, claim.key, claim.job)


def mark_dropped(app: Any, dropped: Dropped) -> None:
    """A dropped run never runs: its result says REVOKED, where the app keeps
    results (else it would show PARKED, or PENDING, until it expired)."""
    if dropped.run.task_id is None or isinstance(app.backend, DisabledBackend):
        return
    app.backend.mark_as_revoked(dropped.run.task_id, reason="parked run dropped by an operator")


def republish(app: Any, dropped: Dropped) -> str:
    """Publish a dropped parked run's message again, as a new contender: its
    parked token is taken off (so it contends for the lock afresh and parks
    again, in its old place, if the lock is still held).  Returns the task id."""
    sig = parking.decode(dropped.payload)
    headers = (sig.get("options") or {}).get("headers") or {}
    headers.pop(parking.PARK_HEADER, None)
    result = app.signature(sig).apply_async()
    return str(result.id)
