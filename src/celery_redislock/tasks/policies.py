"""What a LockedTask run does when its lock is held: the contention policies.

``retry``, ``skip``, ``wait``, ``fail`` and ``park``.  Each function that
applies one ends the run by raising (Retry, Ignore or an exception); the
task's ``__call__`` has not entered the body, and holds nothing.  The pure
decisions (owner tokens, backoff, the policy that applies to a run) come
first.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any, Optional

from celery.exceptions import Ignore, Retry

from .. import config, signals
from ..exceptions import BackendUnavailable, LockContended, TaskSkipped
from ..primitives import Primitive
from . import parked_state, parking
from .messages import REDIS_ERROR_RETRIES_HEADER, RETRIES_HEADER, header, message_headers
from .owners import holder_task_id

__all__ = [
    "Parked",
    "backoff",
    "contended",
    "effective_policy",
    "end_without_running",
    "parked",
    "retry_later",
    "unreachable",
]

logger = logging.getLogger("celery_redislock")


class Parked(Ignore):  # type: ignore[misc]
    """The run ended because its job goes on elsewhere: its message waits in
    Redis (parked), or another delivery of it runs."""


def backoff(attempt: int, base: float, cap: float, rand: Optional[random.Random] = None) -> float:
    """Delay before contention retry number ``attempt`` (0-based), in seconds.

    Exponential (``base * 2**attempt``), capped at ``cap``, with "equal
    jitter": uniformly between half and all of it, so duplicates that collided
    once spread out instead of colliding again.
    """
    ceiling = float(min(cap, base * 2.0 ** min(attempt, 62)))
    r: float = (rand or random).random()
    return ceiling / 2 + r * ceiling / 2


def effective_policy(policy: str, is_eager: bool) -> str:
    """The policy that applies to one run.

    Eager runs (``apply()``, ``task_always_eager``) have no broker to re-send
    to, so ``retry`` and ``park`` wait instead (``park`` would leave the run
    parked in Redis, with nobody to run it when it is handed over).
    """
    if is_eager and policy in ("retry", "park"):
        return "wait"
    return policy


# -- applying a policy -------------------------------------------------------------


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


def outcome(
    task: Any, request: Any, prim: Primitive, policy: str, what: str, level: int = logging.WARNING
) -> None:
    """The one log line of a contention outcome: task, lock, holder, policy.

    WARNING, but INFO for a park: that is the policy's normal path, not a run lost.
    """
    logger.log(
        level,
        "%s[%s]: %s %r is held by task %s; %s (on_contention=%s)",
        task.name,
        request.id,
        prim.noun,
        prim.name,
        holder_task_id(prim.holder),
        what,
        policy,
    )


def contended(
    task: Any,
    request: Any,
    prim: Primitive,
    policy: str,
    ending: Optional[Callable[[], None]] = None,
) -> None:
    """The lock is held by someone else; apply ``policy`` (never returns).
    ``ending``: what ends the run's job, called before a skip stores its
    outcome (whoever reads that outcome may publish the job again)."""
    ttl_ms = prim.holder_ttl_ms
    waited = ""
    if policy == "wait":  # the wait timed out
        waited = f"waited {task.lock_option('lock_wait_timeout', request)} s, then "
        fallback = "fail" if request.is_eager else task.lock_option("lock_wait_fallback", request)
        policy = f"wait, then {fallback}"
    holder = _announce(task, request, prim, policy)
    what = f"{prim.noun} {prim.name!r} is held by task {holder} for another {ttl_ms} ms"
    if policy == "skip":
        skip(task, request, prim, holder, ttl_ms, ending)
    if policy.endswith("fail"):
        outcome(task, request, prim, policy, f"{waited}failed with LockContended")
        raise LockContended(f"{task.name}[{request.id}]: {what}", prim.key, holder, ttl_ms)
    retry_later(task, request, LockContended(what, prim.key, holder, ttl_ms), prim, policy)


def skip(
    task: Any,
    request: Any,
    prim: Primitive,
    holder: Optional[str],
    ttl_ms: Optional[int],
    ending: Optional[Callable[[], None]] = None,
) -> None:
    exc = TaskSkipped(
        f"{task.name}[{request.id}] skipped: {prim.noun} {prim.name!r} is held by task {holder}",
        prim.key,
        holder,
        ttl_ms,
    )
    outcome(task, request, prim, "skip", "skipped")
    signals.task_skipped.send(
        sender=task, request=request, key=prim.key, name=prim.name, holder=holder
    )
    if ending is not None:
        ending()
    end_without_running(task, request, exc)


def end_without_running(task: Any, request: Any, exc: Exception) -> None:
    """End a run whose body will not run, visibly: FAILURE with ``exc`` (never returns).

    ``get()`` raises ``exc`` promptly.  No errbacks run (this is not an
    error of the task); chained tasks are marked too and a chord counts the
    part, so nothing downstream waits forever.  Ignore then stops the tracer
    from storing anything else or running callbacks.  Eager runs raise ``exc``.
    """
    if request.is_eager:
        raise exc
    value = getattr(request, "ignore_result", None)
    ignore_result = bool(task.ignore_result if value is None else value)
    task.backend.mark_as_failure(
        request.id, exc, request=request, call_errbacks=False, store_result=not ignore_result
    )
    raise Ignore(str(exc))


def retry_later(
    task: Any,
    request: Any,
    reason: Exception,
    prim: Optional[Primitive] = None,
    policy: str = "retry",
) -> None:
    """Re-send this run's message after a jittered backoff (never returns).

    Same task id, args, kwargs, routing, priority, headers (per-call options
    included), links and chain.  Celery's own ``retries`` is left as it was.
    A contention retry (``reason`` a LockContended) counts in the
    ``redislock_retries`` header against ``lock_retry_max``; a re-send because
    the store is unreachable (a BackendUnavailable) in the
    ``redislock_redis_error_retries`` header against
    ``lock_redis_error_retries``.  Once its limit is reached the run fails
    with ``reason``'s class, saying how many re-sends it had.
    """
    # Two counters, in headers of our own, rather than Celery's
    # request.retries: that one is the task's own max_retries budget (its
    # self.retry() calls), which neither kind of wait may use up.  And apart
    # from each other: an outage must not use up the contention budget of a
    # run that then meets a holder, nor a long wait behind a holder leave no
    # re-send for an outage.  Each kind's backoff grows with its own count.
    unreachable = isinstance(reason, BackendUnavailable)
    counter = REDIS_ERROR_RETRIES_HEADER if unreachable else RETRIES_HEADER
    option = "lock_redis_error_retries" if unreachable else "lock_retry_max"
    headers = message_headers(request)
    attempt = int(header(request, counter) or 0)
    limit = task.lock_option(option, request)
    if limit is not None and attempt >= limit:
        _give_up(task, request, reason, prim, policy, attempt, option, limit)
    cap = task.lock_option("lock_retry_backoff_max", request)
    vt = config.visibility_timeout(task.app.conf)
    if vt is not None:
        cap = min(cap, vt / 2)  # a countdown past it would be redelivered: a duplicate run
    delay = backoff(attempt, task.lock_option("lock_retry_backoff", request), cap)
    if prim is not None:
        outcome(task, request, prim, policy, f"retry {attempt + 1} in {delay:.2f} s")
    headers[counter] = attempt + 1
    sig = task.signature_from_request(request, countdown=delay, headers=headers)
    sig.apply_async()  # if this fails, the run fails visibly with the error
    why = "lock store unreachable" if unreachable else "lock contended"
    of = f" of {limit}" if limit is not None else ""
    raise Retry(f"{why}, retry {attempt + 1}{of} in {delay:.2f}s", exc=reason, when=delay, sig=sig)


def _give_up(
    task: Any,
    request: Any,
    reason: Exception,
    prim: Optional[Primitive],
    policy: str,
    attempt: int,
    option: str,
    limit: int,
) -> None:
    """The run has had its ``limit`` re-sends: it fails with ``reason``'s class."""
    if isinstance(reason, LockContended):
        if prim is not None:
            outcome(task, request, prim, policy, f"failed after {attempt} contention retries")
        raise LockContended(
            f"{task.name}[{request.id}]: gave up after {attempt} contention retries; {reason}",
            reason.key,
            reason.holder,
            reason.ttl_ms,
        ) from reason
    if isinstance(reason, BackendUnavailable):
        logger.error(
            "%s[%s]: lock store still unreachable after %d re-sends (%s=%s); failed",
            task.name,
            request.id,
            attempt,
            option,
            limit,
        )
        raise BackendUnavailable(
            f"{task.name}[{request.id}]: lock store still unreachable after {attempt} "
            f"re-sends ({option}={limit}); {reason}"
        ) from reason
    raise reason


def parked(task: Any, request: Any, prim: Primitive) -> None:
    """This run's message now waits in the primitive's queue (never returns)."""
    parking.register(prim, (prim.holder_ttl_ms or 0) + 50)
    holder = _announce(task, request, prim, "park")
    parked_state.mark_parked(task, request, prim, holder)
    outcome(task, request, prim, "park", "parked until it is released", logging.INFO)
    raise Parked(f"parked behind task {holder}")


def unreachable(task: Any, request: Any, name: str, exc: BackendUnavailable) -> None:
    """The lock store could not be reached for ``name``: apply
    ``lock_on_redis_error`` (returns only for ``"run"``: the run goes on)."""
    policy = task.lock_option("lock_on_redis_error", request)
    logger.error(
        "%s[%s]: lock store unreachable for %r (lock_on_redis_error=%s): %s",
        task.name,
        request.id,
        name,
        policy,
        exc,
    )
    if policy == "run":
        return
    if policy == "retry" and not request.is_eager:
        retry_later(task, request, exc)
    raise exc
