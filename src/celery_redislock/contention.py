"""What a LockedTask run does when its lock is held: the contention policies.

Each function ends the run by raising (Retry, Ignore or an exception); the
task's ``__call__`` has not entered the body, and holds nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from celery.exceptions import Ignore, Retry

from . import config, park, signals
from .exceptions import LockContended, TaskSkipped
from .policy import RETRIES_HEADER, backoff, holder_task_id
from .primitive import Primitive

__all__ = ["contended", "parked", "retry_later"]

logger = logging.getLogger("celery_redislock")


def _announce(task: Any, request: Any, prim: Primitive, policy: str) -> Optional[str]:
    """Send ``lock_contended`` for this run; returns the holder's task id."""
    holder = holder_task_id(prim.holder)
    signals.lock_contended.send(
        sender=task,
        request=request,
        key=prim.key,
        name=prim.name,
        holder=holder,
        ttl_ms=prim.holder_ttl_ms,
        policy=policy,
    )
    return holder


def contended(task: Any, request: Any, prim: Primitive, policy: str) -> None:
    """The lock is held by someone else; apply ``policy`` (never returns)."""
    ttl_ms = prim.holder_ttl_ms
    if policy == "wait":  # the wait timed out
        policy = "fail" if request.is_eager else task.lock_option("lock_wait_fallback")
    holder = _announce(task, request, prim, policy)
    what = f"{prim.kind} {prim.name!r} is held by task {holder} for another {ttl_ms} ms"
    if policy == "skip":
        skip(task, request, prim, holder, ttl_ms)
    if policy == "fail":
        raise LockContended(f"{task.name}[{request.id}]: {what}", prim.key, holder, ttl_ms)
    retry_later(task, request, LockContended(what, prim.key, holder, ttl_ms))


def skip(
    task: Any, request: Any, prim: Primitive, holder: Optional[str], ttl_ms: Optional[int]
) -> None:
    exc = TaskSkipped(
        f"{task.name}[{request.id}] skipped: {prim.kind} {prim.name!r} is held by task {holder}",
        prim.key,
        holder,
        ttl_ms,
    )
    logger.info("%s", exc)
    signals.task_skipped.send(
        sender=task, request=request, key=prim.key, name=prim.name, holder=holder
    )
    if request.is_eager:
        raise exc
    # FAILURE with TaskSkipped: get() raises promptly and names the holder.
    # No errbacks (a skip is not an error); chained tasks are marked too, so
    # nothing downstream waits forever.  Ignore then stops the tracer from
    # storing anything else or running callbacks.
    value = getattr(request, "ignore_result", None)
    ignore_result = bool(task.ignore_result if value is None else value)
    task.backend.mark_as_failure(
        request.id, exc, request=request, call_errbacks=False, store_result=not ignore_result
    )
    raise Ignore(str(exc))


def retry_later(task: Any, request: Any, reason: Exception) -> None:
    """Re-send this run's message after a jittered backoff (never returns).

    Same task id, args, kwargs, routing, priority, headers, links and chain.
    Celery's own ``retries`` is left as it was; contention retries are counted
    in the ``redislock_retries`` header against ``lock_retry_max``.
    """
    headers = dict(request.headers or {})
    attempt = int(headers.get(RETRIES_HEADER) or getattr(request, RETRIES_HEADER, 0) or 0)
    limit = task.lock_option("lock_retry_max")
    if limit is not None and attempt >= limit:
        if isinstance(reason, LockContended):
            raise LockContended(
                f"{task.name}[{request.id}]: gave up after {attempt} contention retries; {reason}",
                reason.key,
                reason.holder,
                reason.ttl_ms,
            ) from reason
        raise reason
    cap = task.lock_option("lock_retry_backoff_max")
    vt = config.visibility_timeout(task.app.conf)
    if vt is not None:
        cap = min(cap, vt / 2)  # a countdown past it would be redelivered: a duplicate run
    delay = backoff(attempt, task.lock_option("lock_retry_backoff"), cap)
    headers[RETRIES_HEADER] = attempt + 1
    sig = task.signature_from_request(request, countdown=delay, headers=headers)
    sig.apply_async()  # if this fails, the run fails visibly with the error
    raise Retry(
        f"lock contended, retry {attempt + 1} in {delay:.2f}s", exc=reason, when=delay, sig=sig
    )


def parked(task: Any, request: Any, prim: Primitive, kind: Optional[str]) -> None:
    """This run's message now waits in the primitive's queue (never returns)."""
    park.register(prim, kind, (prim.holder_ttl_ms or 0) + 50)
    holder = _announce(task, request, prim, "park")
    logger.info(
        "%s[%s] parked behind task %s on %s %r", task.name, request.id, holder, prim.kind, prim.name
    )
    raise Ignore(f"parked behind task {holder}")
