"""How a LockedTask run takes its start under a rate limit, before its body runs.

A task with ``global_rate_limit="100/m"`` (or ``rate_limit_group="stripe"``,
a limit named in ``redislock_rate_limits``) takes one start slot per run,
in one script call on the server's clock (:mod:`celery_redislock.primitives.rates`),
with ``rate_limit_key`` making it one limit per key.  Over the limit, the
run does what ``on_rate_limited`` says:

- ``defer`` (the default): the call reserves the next free slot, and the
  run is re-sent once, with a countdown to that slot, holding no worker
  process meanwhile.  The copy carries the ``redislock_rate_slot`` header:
  it starts at its slot without asking again.  A slot further away than
  the broker lets a worker hold a message unacknowledged (half the Redis
  or SQS visibility timeout; :data:`HOP_CAP` elsewhere) is reached in hops of
  at most that, each re-sent with the rest of the wait in the header, so the
  broker never delivers the same message twice.
- ``wait``: the run sleeps in the worker until its slot, when that is within
  ``lock_wait_timeout``; else ``lock_wait_fallback`` (``retry``: defer).
- ``skip``: TaskSkipped, at once; ``fail``: RateLimited, at once.

With a lock, the start rides on the lock's acquire where that acquire does
not wait (``on_contention`` retry, skip, fail, and park's first attempt): one
script call takes both or neither, and a run over the limit touches no lock.
Where the acquire waits (``wait``, a parked run's claim of its grant), or the
two keys live on different Redis Cluster nodes, the start is taken first, in
a call of its own: a run that then finds its lock held has spent its start,
so the limit errs towards fewer starts, never more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

from celery.exceptions import Retry

from .. import _validate, config, signals
from ..exceptions import BackendUnavailable, ConfigurationError, RateLimited, TaskSkipped
from ..primitives import Primitive, RateLimiter, keys, unique
from ..primitives.rates import Rate, Slot, Start, rate
from . import policies
from .messages import RATE_HEADER, header, message_headers

__all__ = ["HOP_CAP", "Carried", "check_options", "enter", "limit_for", "over_limit"]

logger = logging.getLogger("celery_redislock")

#: The longest countdown of one hop where the broker has no visibility
#: timeout, in seconds: RabbitMQ closes a channel whose message stays
#: unacknowledged past its consumer_timeout (30 minutes by default).
HOP_CAP = 900.0


def check_options(cls: Any, name: str, groups: Optional[dict[str, Any]]) -> None:
    """Check a task class's rate-limit options and set ``_redislock_rate``
    (the parsed ``global_rate_limit``).  ``groups``: the app's rate limits, or None
    where the app is not known yet (the group is then checked at its first run)."""
    where = f"task {name!r}: option"
    limit, group, key = cls.global_rate_limit, cls.rate_limit_group, cls.rate_limit_key
    if limit is not None and group is not None:
        raise ConfigurationError(
            f"task {name!r}: options global_rate_limit and rate_limit_group exclude each "
            "other; choose one"
        )
    if key is not None and limit is None and group is None:
        raise ConfigurationError(
            f"task {name!r}: option rate_limit_key={key!r} needs global_rate_limit or "
            "rate_limit_group"
        )
    cls._redislock_rate = None if limit is None else rate(limit, f"{where} global_rate_limit")
    if group is not None:
        _validate.check_name(group, f"{where} rate_limit_group")
        if groups:
            _group_limit(name, group, groups)


def _group_limit(task_name: str, group: str, groups: dict[str, Any]) -> Rate:
    """The rate of ``group`` in ``redislock_rate_limits`` (parsed by Settings)."""
    limit = _validate.named(
        f"task {task_name!r}: rate_limit_group", group, groups, "redislock_rate_limits"
    )
    return rate(limit, f"redislock_rate_limits[{group!r}]")


def limit_for(
    task: Any, args: Sequence[Any], kwargs: dict[str, Any], settings: config.Settings
) -> Optional[tuple[str, Rate]]:
    """(name, rate) of the limit a call of ``task`` takes its start from, or None."""
    group = task.rate_limit_group
    if group is not None:
        base, limit = f"group:{group}", _group_limit(task.name, group, settings.rate_limits)
    elif task._redislock_rate is not None:
        base, limit = task.name, task._redislock_rate
    else:
        return None
    spec = task._redislock_rate_keyspec
    part = spec.key(args or (), kwargs or {}) if spec is not None else ""
    return (f"{base}:{part}" if part else base), limit


class Carried(NamedTuple):
    """A run's start, carried by its lock's acquire (taken only with the lock)."""

    name: str
    start: Start


def enter(
    task: Any,
    request: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    settings: config.Settings,
    overrides: Any,
    ending: Optional[Callable[[], None]] = None,
    prim: Optional[Primitive] = None,
) -> Optional[Carried]:
    """Take the run's start, or end the run as ``on_rate_limited`` says (by
    raising).  ``ending``: what ends the run's job (a unique job's key), for
    ``skip`` and ``fail``.

    With ``prim``, the run's lock, whose next acquire does not wait: the
    start is not taken here but returned, for that acquire to carry (one
    round trip for both, and the start is taken only with the lock), unless
    the two keys live on different nodes of a Redis Cluster.
    """
    found = limit_for(task, args, kwargs, settings)
    if found is None:
        return None
    name, limit = found
    key = keys.rate_key(settings.key_prefix, name)
    rest = header(request, RATE_HEADER)
    if rest is not None:
        # A deferred run: its slot was reserved as it was deferred.
        if float(rest) > 0:
            _defer(task, request, name, key, limit, float(rest), "defer")
        return None
    client = config.client_for(task.app)
    if prim is not None and unique.foldable(client, key, prim.key):
        return Carried(name, Start(key, limit))
    limiter = RateLimiter(client, name, limit, prefix=settings.key_prefix)
    _admit(task, request, limiter, settings, overrides, ending)
    return None


def over_limit(
    task: Any,
    request: Any,
    carried: Carried,
    delay: float,
    settings: config.Settings,
    overrides: Any,
    ending: Optional[Callable[[], None]] = None,
) -> None:
    """The run's acquire carried its start and found none free for ``delay``
    seconds (nothing was taken): apply ``on_rate_limited``.  Returns only when
    the run has taken a start now (``wait``): it then takes its lock alone."""
    limiter = RateLimiter(
        config.client_for(task.app), carried.name, carried.start.limit, prefix=settings.key_prefix
    )
    _admit(task, request, limiter, settings, overrides, ending, delay)


def _admit(
    task: Any,
    request: Any,
    limiter: RateLimiter,
    settings: config.Settings,
    overrides: Any,
    ending: Optional[Callable[[], None]],
    over: Optional[float] = None,
) -> None:
    """Take a start with ``limiter`` as ``on_rate_limited`` says, or end the
    run; ``over``: the seconds to the next free start, when already known."""
    name = limiter.name
    policy = task._redislock_option("on_rate_limited", overrides, settings)
    if request.is_eager and policy == "defer":
        policy = "wait"  # no broker to re-send to
    wait_timeout = task._redislock_option("lock_wait_timeout", overrides, settings)
    ahead = {"defer": None, "wait": wait_timeout}.get(policy, 0.0)
    try:
        # skip, fail after a carried start found none: nothing to take
        slot = Slot(False, over) if over is not None and ahead == 0.0 else limiter.take(ahead)
        if not slot.taken and policy == "wait" and _fallback(task, request) == "retry":
            policy, slot = "defer", limiter.take(None)
    except BackendUnavailable as exc:
        policies.unreachable(task, request, name, exc)
        return  # lock_on_redis_error="run": the run starts without its rate limit
    if slot.taken and slot.delay <= 0:
        return
    signals.rate_limited.send(
        sender=task, request=request, key=limiter.key, name=name, delay=slot.delay, policy=policy
    )
    if slot.taken and policy == "wait":
        time.sleep(slot.delay)
        return
    if slot.taken:
        _defer(task, request, name, limiter.key, limiter.limit, slot.delay, policy)
    what = f"rate limit {name!r} ({limiter.limit}): the next start is free in {slot.delay:.3f} s"
    if policy == "skip":
        logger.warning("%s[%s]: %s; skipped (on_rate_limited=skip)", task.name, request.id, what)
        signals.task_skipped.send(
            sender=task, request=request, key=limiter.key, name=name, holder=None
        )
        if ending is not None:
            ending()
        skipped = TaskSkipped(f"{task.name}[{request.id}] skipped: {what}", limiter.key)
        policies.end_without_running(task, request, skipped)
    logger.warning("%s[%s]: %s; failed (on_rate_limited=%s)", task.name, request.id, what, policy)
    if ending is not None:
        ending()
    raise RateLimited(f"{task.name}[{request.id}]: {what}", limiter.key, slot.delay)


def _fallback(task: Any, request: Any) -> str:
    return "fail" if request.is_eager else str(task.lock_option("lock_wait_fallback", request))


def _defer(
    task: Any, request: Any, name: str, key: str, limit: Rate, delay: float, policy: str
) -> None:
    """Re-send the run to start ``delay`` seconds from now, at the slot it
    holds (never returns); in hops where the broker could redeliver it."""
    vt = config.visibility_timeout(task.app.conf)
    countdown = min(delay, vt / 2 if vt is not None else HOP_CAP)
    headers = message_headers(request)
    headers[RATE_HEADER] = round(delay - countdown, 6)
    sig = task.signature_from_request(request, countdown=countdown, headers=headers)
    sig.apply_async()  # if this fails, the run fails visibly with the error
    logger.info(
        "%s[%s]: rate limit %r (%s): deferred %.3f s to its slot (on_rate_limited=%s)",
        task.name,
        request.id,
        name,
        limit,
        delay,
        policy,
    )
    reason = RateLimited(f"rate limit {name!r} ({limit}): deferred to its slot", key, delay)
    raise Retry(f"rate limited, deferred {countdown:.3f}s", exc=reason, when=countdown, sig=sig)
