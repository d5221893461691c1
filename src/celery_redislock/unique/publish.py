"""Publishing a unique job: one round trip to the lock store, no message for a duplicate.

:func:`publish` runs for every publish of a task with a unique-job policy
(``apply_async``, ``delay``, a signature, a canvas, beat, and ``send_task``
by name for the tasks ``redislock_tasks`` names).  It takes the job's key
in the lock store, then sends the message carrying its claim (the
``redislock_unique`` header), so the run can start and end the claim in its
lock's own script calls.  A duplicate sends nothing and returns the job
holding the key, or raises :class:`~celery_redislock.AlreadyQueued`.

Inside a canvas (a chain after it, link or link_error callbacks, a chord or
a group), a duplicate returned in place of the new job would silently drop
the rest of the canvas: it is sent instead, marked to end at once as a
FAILURE with AlreadyQueued (``action="fail"``), so the chain stops, the
chord's body learns of it, and the group's result shows it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Optional

from kombu.utils.uuid import uuid

from .. import config, signals
from ..exceptions import AlreadyQueued, BackendUnavailable
from ..primitives import keys, unique
from ..tasks.messages import CALL_OPTIONS_HEADER, DUPLICATE_HEADER, UNIQUE_HEADER
from .policy import CALL_OPTIONS, Policy, resolve

__all__ = [
    "announce",
    "claim_header",
    "delay_of",
    "key_name",
    "per_call_options",
    "policy_for",
    "publish",
    "take",
]

logger = logging.getLogger("celery_redislock")

#: apply_async options that carry more of a canvas than this one job.
_CANVAS = ("chain", "link", "link_error", "chord", "group_id")


def policy_for(
    app: Any, task_name: str, attributes: Mapping[str, Any], per_call: Mapping[str, Any]
) -> Optional[Policy]:
    """The unique-job policy of one publish (None: not unique): per-call
    options over the task's ``attributes``, over the settings."""
    values = {o: per_call[o] if o in per_call else attributes.get(o) for o in CALL_OPTIONS}
    settings = config.settings_for(app)
    return resolve(task_name, values, settings.unique_ttl, settings.on_duplicate)


def key_name(task_name: str, part: str) -> str:
    """The unique key's name: the task's name and the call's key part."""
    return f"{task_name}:{part}" if part else task_name


def publish(
    app: Any,
    sender: Any,
    task_name: str,
    pol: Policy,
    part: str,
    options: dict[str, Any],
    send: Callable[[dict[str, Any]], Any],
    result: Callable[[str], Any],
) -> Any:
    """Publish one job under ``pol``: ``send(options)`` it, or return
    ``result(holder)`` for a duplicate (or raise AlreadyQueued).

    ``options`` are the publish's apply_async options, a dict of its own
    (its ``headers`` too); ``part`` is the call's unique key part.
    """
    headers = options["headers"] = dict(options.get("headers") or {})
    # A copy of a message that already held its key: a retry, a re-published
    # parked run.  It is the same job, never refused as a duplicate of itself.
    again = UNIQUE_HEADER in headers
    task_id = options.get("task_id") or uuid()
    options["task_id"] = task_id
    delay = _delay(app, options.get("countdown"), options.get("eta"))
    if pol.debounce is not None:
        if options.get("eta") is None:
            options["countdown"] = delay + pol.debounce
        else:
            options["eta"] = _later(options["eta"], pol.debounce)
    client = config.client_for(app)
    key, outcome = take(app, task_name, pol, part, task_id, delay, again)
    if outcome.accepted:
        headers[UNIQUE_HEADER] = claim_header(key, pol)
        if outcome.other is not None:
            announce(sender, task_name, key, task_id, outcome.other, "replace")
        try:
            return send(options)
        except BaseException:
            _forget(client, key, task_id)
            raise
    holder = outcome.other or ""
    headers.pop(UNIQUE_HEADER, None)
    if pol.on_duplicate == "raise":
        announce(sender, task_name, key, task_id, holder, "raise")
        raise AlreadyQueued(
            f"{task_name}: a job with unique key {key!r} is already queued: task {holder} "
            f"(for another {outcome.ttl_ms} ms at most)",
            key,
            holder,
            outcome.ttl_ms,
        )
    if any(options.get(o) for o in _CANVAS):
        announce(sender, task_name, key, task_id, holder, "fail")
        headers[DUPLICATE_HEADER] = holder
        return send(options)
    announce(sender, task_name, key, task_id, holder, "return")
    return result(holder)


def take(
    app: Any, task_name: str, pol: Policy, part: str, task_id: str, delay: float, again: bool
) -> tuple[str, unique.Published]:
    """Take the job's key for ``task_id`` (one round trip): (the key, the outcome)."""
    key = keys.unique_key(config.settings_for(app).key_prefix, key_name(task_name, part))
    if pol.debounce is not None:
        delay += pol.debounce
    outcome = unique.publish(
        config.client_for(app),
        key,
        task_id,
        pol.mode,
        to_ms(pol.ttl + delay),
        replace=pol.replaces,
        throttle_ms=0 if pol.throttle is None else to_ms(pol.throttle),
        again=again,
    )
    return key, outcome


def claim_header(key: str, pol: Policy) -> list[Any]:
    """The ``redislock_unique`` header of an accepted job: [key, mode, hold ms]."""
    return [key, pol.mode, to_ms(pol.ttl)]


def announce(sender: Any, task_name: str, key: str, task_id: str, other: str, action: str) -> None:
    """``task_duplicate``, and one log line naming both jobs."""
    what = {
        "return": "returned the queued job",
        "raise": "raised AlreadyQueued",
        "replace": "replaced the queued job",
        "fail": "sent inside a canvas, to fail as AlreadyQueued",
    }[action]
    logger.info(
        "%s[%s]: duplicate of task %s (unique key %s); %s (on_duplicate=%s)",
        task_name,
        task_id,
        other,
        key,
        what,
        "return" if action == "fail" else action,
    )
    signals.task_duplicate.send(
        sender=sender, key=key, task_id=task_id, existing_id=other, action=action
    )


def _forget(client: Any, key: str, task_id: str) -> None:
    """The message was not sent: the key it took must not stay taken."""
    try:
        unique.drop(client, key, task_id)
    except BackendUnavailable:
        logger.warning("could not free unique key %s of unsent task %s", key, task_id)


def _delay(app: Any, countdown: Any, eta: Any) -> float:
    """Seconds until the message may run (its countdown or ETA), 0 for now."""
    if countdown:
        return max(0.0, float(countdown))
    if eta is None:
        return 0.0
    if isinstance(eta, str):
        eta = datetime.fromisoformat(eta)
    now = app.now() if eta.tzinfo is not None else datetime.now()
    return max(0.0, float((eta - now).total_seconds()))


def delay_of(app: Any, eta: Any) -> float:
    """Seconds until a message's ETA (None: now)."""
    return _delay(app, None, eta)


def _later(eta: Any, seconds: float) -> Any:
    if isinstance(eta, str):
        eta = datetime.fromisoformat(eta)
    return eta + timedelta(seconds=seconds)


def to_ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def per_call_options(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """The per-call options a publish carries in its headers."""
    headers = options.get("headers") or {}
    return headers.get(CALL_OPTIONS_HEADER) or {}
