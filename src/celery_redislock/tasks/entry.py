"""How a LockedTask run takes its lock, before its body runs.

A rate-limited run takes its start under the limit before its body
(:mod:`celery_redislock.tasks.rate_stage`): with its lock, in the same script
call, where the acquire does not wait; else first, in a call of its own.

:func:`enter` builds the run's primitive, applies the contention policy
when it is held (:mod:`celery_redislock.tasks.policies`), and returns the
run's :class:`~celery_redislock.tasks.hold.Hold`.  A unique job's run also
starts its job's claim on its key in the same script call, and ends at
once, visibly, when a newer publish superseded it or when it is a duplicate
sent only to fail inside a canvas.

A run that ends here without its body running (skipped, failed on
contention, superseded, failed because the store is unreachable, at once or
after its last re-send) ends its job: the job's unique key goes with it.
A run that is re-sent (a contention retry, a retry while the store is
unreachable) or parked is the same job waiting on: it keeps its key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Optional

from celery.exceptions import Retry

from .. import config, signals
from ..exceptions import AlreadyQueued, BackendUnavailable, LockContended, TaskSuperseded
from ..primitives import Kind, Primitive
from ..primitives.tokens import new_token, process
from ..unique.run import UniqueRun, claim_in, duplicate_of
from . import park_recovery, parking, policies, rate_stage, targets
from .hold import Hold
from .messages import CALL_OPTIONS_HEADER, header, message_headers
from .owners import holder_task_id, owner_prefix

__all__ = ["enter"]

logger = logging.getLogger("celery_redislock")

#: Outcomes of taking the lock after which the job goes on (re-sent, parked).
_JOB_GOES_ON = (Retry, policies.Parked)


def enter(task: Any, request: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Optional[Hold]:
    """Take the run's lock, or end the run as its policy says (by raising).

    Returns the run's hold, or None when the run takes no lock: a task with a
    rate limit and no lock, or Redis unreachable and
    ``lock_on_redis_error="run"`` letting the body run without one.
    """
    signals.connect()
    holder = duplicate_of(request)
    if holder is not None:
        exc = AlreadyQueued(
            f"{task.name}[{request.id}]: a duplicate of queued task {holder} inside a "
            "canvas; ended without running",
            "",
            holder,
        )
        policies.end_without_running(task, request, exc)
    # Once per run: the app (a class property), its settings, and the run's
    # per-call options (a message header), for every option read below.
    app = task.app
    settings = config.settings_for(app)
    overrides = header(request, CALL_OPTIONS_HEADER)
    run = _unique_run(task, request)
    policy = policies.effective_policy(
        task._redislock_option("on_contention", overrides, settings), bool(request.is_eager)
    )
    carried = None
    if task._redislock_rated:
        ending = run.drop if run is not None else None
        if not task._redislock_locks:
            rate_stage.enter(task, request, args, kwargs, settings, overrides, ending)
            return None  # a rate limit alone: the run starts, with no lock
    name, kind = task.lock_target_for(args, kwargs)
    prim = primitive(task, request, name, kind, app, settings, overrides)
    if run is not None:
        run.attach(prim)
    # Only a receiver of lock_acquired needs the time taking the lock began.
    began = time.monotonic() if signals.lock_acquired.receivers else 0.0
    try:
        if task._redislock_rated:
            # The start comes before the body: carried by an acquire that
            # does not wait (taken with the lock, or neither), else taken first.
            waits = policy == "wait" or (
                policy == "park" and header(request, parking.PARK_HEADER) is not None
            )
            carried = rate_stage.enter(
                task, request, args, kwargs, settings, overrides, ending, None if waits else prim
            )
            if carried is not None:
                prim.start = carried.start
        if not _take(task, request, prim, run, settings, overrides, policy, carried):
            # Unreachable, and the body runs without a lock: the job starts
            # now, so its key goes (if the store answers; else within its hold).
            if run is not None:
                run.drop()
            return None
    except _JOB_GOES_ON:
        raise
    except BaseException:
        if run is not None and prim.superseded_by is None:
            run.drop()  # the job ends here, before its body: its key goes
        raise
    if run is not None:
        run.started(prim)
    hold = Hold(task, prim, run)
    request.redislock = hold
    request.lock_fence = prim.fence
    if signals.lock_acquired.receivers:  # (else send() does nothing: skip its arguments)
        signals.lock_acquired.send(
            sender=task,
            request=request,
            key=prim.key,
            name=name,
            fence=prim.fence,
            waited=_waited(request, prim, began),
        )
    return hold


def _waited(request: Any, prim: Primitive, began: float) -> float:
    """Seconds a run waited for its lock: a re-published parked run since its
    publish (it waited parked, in Redis), any other since ``began``."""
    if header(request, parking.PARK_HEADER) is not None:
        sent = header(request, parking.SENT_HEADER)
        if sent is not None:
            return max(0.0, time.time() - float(sent) / 1000.0)
    if not began:  # a receiver connected while this run took its lock
        return 0.0
    return max(0.0, (prim.granted_at or began) - began)


def _take(
    task: Any,
    request: Any,
    prim: Primitive,
    run: Any,
    settings: config.Settings,
    overrides: Any,
    policy: str,
    carried: Optional[rate_stage.Carried] = None,
) -> bool:
    """Acquire ``prim`` as the run's policy says; False: unreachable, run anyway.
    ``carried``: the run's start under a rate limit, which the acquire takes."""
    # A re-published parked run claims the grant reserved for it first, and
    # only then asks whether its job was superseded meanwhile (a grant left
    # unclaimed would be re-published again and again).
    parked_run = run is not None and header(request, parking.PARK_HEADER) is not None
    try:
        if run is not None and not parked_run:
            prim.superseded_by = run.superseded(parked_run=False)
        acquired = _attempt(task, request, prim, run, settings, overrides, policy)
        if not acquired and prim.over_rate_for is not None and carried is not None:
            # No start free: nothing was taken.  Defer, skip or fail (raising),
            # or, having waited for a start of its own, take the lock alone.
            ending = run.drop if run is not None else None
            delay = prim.over_rate_for
            rate_stage.over_limit(task, request, carried, delay, settings, overrides, ending)
            prim.start = prim.over_rate_for = None
            acquired = _attempt(task, request, prim, run, settings, overrides, policy)
        if acquired and parked_run:
            prim.superseded_by = run.superseded(parked_run=True)
            if prim.superseded_by is not None:
                prim.release()  # hands over to the next in line
                acquired = False
    except BackendUnavailable as exc:
        policies.unreachable(task, request, prim.name, exc)
        return False
    if prim.superseded_by is not None:
        _superseded(task, request, prim, run)
    if not acquired:
        policies.contended(task, request, prim, policy, run.drop if run is not None else None)
    return True


def _attempt(
    task: Any,
    request: Any,
    prim: Primitive,
    run: Any,
    settings: config.Settings,
    overrides: Any,
    policy: str,
) -> bool:
    """One go at the lock as ``policy`` says: held or not."""
    if prim.superseded_by is not None:
        return False
    if policy == "park":
        return _park(task, request, prim, run)
    if policy == "wait":
        timeout = task._redislock_option("lock_wait_timeout", overrides, settings)
        return prim.acquire(timeout=timeout)
    return prim.acquire(blocking=False)


def primitive(
    task: Any,
    request: Any,
    name: str,
    kind: Kind,
    app: Any,
    settings: config.Settings,
    overrides: Any,
) -> Primitive:
    """The primitive one run of ``task`` takes (a new one per run)."""
    prim = targets.build(
        task,
        name,
        kind,
        config.client_for(app),
        settings.semaphores,
        ttl=task._redislock_option("lock_ttl", overrides, settings),
        prefix=settings.key_prefix,
        renew_interval=task._redislock_option("lock_renew_interval", overrides, settings),
        owner=owner_prefix(request.id, request.hostname, process.pid, task.name),
        fence_retention=settings.fence_retention,
        wait_replicas=settings.wait_replicas,
        wait_timeout_ms=settings.wait_timeout_ms,
    )
    prim.task = task  # type: ignore[attr-defined]  # for lock_lost receivers
    return parking.configure(prim, settings.park_reserve, parking.publisher(app, prim))


def _unique_run(task: Any, request: Any) -> Optional[UniqueRun]:
    """The run's claim on its job's unique key, when its message carries one."""
    claim = claim_in(request, request.id, bool(task.acks_late))
    if claim is None:
        return None
    return UniqueRun(config.client_for(task.app), claim)


def _superseded(task: Any, request: Any, prim: Primitive, run: Any) -> None:
    by = prim.superseded_by
    key = run.claim.key if run is not None else ""
    logger.info("%s[%s]: superseded by task %s (unique key %s)", task.name, request.id, by, key)
    exc = TaskSuperseded(
        f"{task.name}[{request.id}] superseded by task {by} (unique key {key!r})", key, by
    )
    policies.end_without_running(task, request, exc)


def _retoken(task: Any, request: Any, prim: Primitive) -> None:
    """A re-published parked run holds under the token it parked with, which
    names the worker where it parked: it takes one naming this worker and
    process, so operators see who holds it (one more round trip, on this
    path only).  Unreachable, it goes on under the old token, still held."""
    try:
        prim.retoken(new_token(owner_prefix(request.id, request.hostname, process.pid, task.name)))
    except BackendUnavailable:
        logger.warning("%s[%s]: holds %r under its parked token", task.name, request.id, prim.name)


def _park(task: Any, request: Any, prim: Primitive, run: Any) -> bool:
    headers = message_headers(request)
    token = headers.get(parking.PARK_HEADER)
    parked_run = token is not None
    if token is None:
        token = new_token(owner_prefix(request.id, request.hostname, process.pid, task.name))
        headers[parking.PARK_HEADER] = token
    sig = task.signature_from_request(request, headers=headers)
    payload = parking.encode(sig, task.serializer or task.app.conf.task_serializer)
    order = headers.get(parking.SENT_HEADER)
    status = prim.park(
        token, payload, parked_run=parked_run, order_ms=float(order) if order else None
    )
    parking.ensure_sweeper(task.app)
    if status == "held":
        if parked_run:
            _retoken(task, request, prim)
        return True
    if status in ("superseded", "over rate"):
        return False
    if status == "unreplicated":
        # Not parked: its message goes back to the broker, a fresh arrival
        # (without the park token: the entry under it is gone).
        if request.headers:
            request.headers.pop(parking.PARK_HEADER, None)
        reason = LockContended(
            f"{prim.noun} {prim.name!r}: parked entry not acknowledged by the replicas",
            prim.key,
            holder_task_id(prim.holder),
            prim.holder_ttl_ms,
        )
        policies.retry_later(task, request, reason, prim, "park")
    if status == "duplicate":
        logger.warning(
            "%s[%s]: a second delivery of a parked run that already ran; dropped",
            task.name,
            request.id,
        )
        raise policies.Parked("duplicate delivery of a parked run")
    park_recovery.memory().add(token, task, request.id, prim, payload)
    if run is not None:
        run.parked()
    policies.parked(task, request, prim)
    return False  # pragma: no cover
