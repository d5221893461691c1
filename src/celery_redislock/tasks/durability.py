"""Whether the lock store keeps parked runs across a restart, checked as a worker starts.

A parked run's message (``on_contention="park"``) has one copy: in the lock
store.  A store without persistence loses it when it restarts; one with RDB
snapshots only, whatever was parked since the last snapshot.  When any task
of the app can park, the worker reads ``CONFIG GET appendonly`` and
``CONFIG GET save`` once and says so in one WARNING, with the remedy.  A rate
limit's state lives there too: lost, the runs that come next may start beyond
their limit for up to one period, and the worker says so as well.  A
store that refuses CONFIG (managed Redis, an ACL without ``+config|get``) is
noted once at INFO; an unreachable one is left to the start-up ping.

The check runs in a thread of its own: the worker does not wait for it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from redis.exceptions import ResponseError

from .. import config, transport
from ..primitives.protocol import decode
from . import task_rules
from .locked_task import LockedTask

__all__ = ["can_park", "check_durability", "rate_limited", "verdict"]

logger = logging.getLogger("celery_redislock")

_REMEDY = (
    "to keep them, set appendonly yes and appendfsync everysec on the store, and for "
    "a failover give it a replica and set redislock_wait_replicas=1"
)


def can_park(app: Any, settings: config.Settings) -> list[str]:
    """The names of ``app``'s tasks that park when contended (task attribute,
    ``redislock_tasks`` entry, or ``redislock_on_contention``)."""
    names = []
    for name, task in sorted(app.tasks.items()):
        if isinstance(task, LockedTask):
            policy = task._redislock_option("on_contention", None, settings)
        else:
            opts = task_rules.options_of(app, name)
            if opts is None:
                continue
            policy = opts.get("on_contention") or settings.on_contention
        if policy == "park":
            names.append(name)
    return names


def rate_limited(app: Any) -> list[str]:
    """The names of ``app``'s tasks that start under a rate limit."""
    return [
        name
        for name, task in sorted(app.tasks.items())
        if isinstance(task, LockedTask) and task._redislock_rated
    ]


def verdict(appendonly: str, save: str) -> Optional[str]:
    """What a restart of a store so configured loses of the parked runs, or None."""
    if appendonly.strip().lower() == "yes":
        return None
    if save.strip():
        return (
            f"the lock store saves RDB snapshots only (save {save!r}, appendonly no): "
            "parked runs stored since its last snapshot are lost when it restarts"
        )
    return (
        "the lock store keeps no data on disk (appendonly no, save ''): every parked "
        "run, whose only copy is in the lock store, is lost when it restarts"
    )


def check_durability(app: Any, settings: config.Settings) -> Optional[threading.Thread]:
    """Start the check when a task of ``app`` can park or is rate limited;
    the thread, or None."""
    parking, rated = can_park(app, settings), rate_limited(app)
    if not parking and not rated:
        return None
    thread = threading.Thread(
        target=_check, args=(app, parking, rated), name="redislock-durability", daemon=True
    )
    thread.start()
    return thread


def _check(app: Any, parking: list[str], rated: list[str]) -> None:
    try:
        client = config.client_for(app)
        appendonly = _config_get(client, "appendonly")
        save = _config_get(client, "save")
    except ResponseError as exc:
        if not parking:
            return  # a rate limit's state is worth no note where CONFIG is refused
        logger.info(
            "celery_redislock: the lock store refuses CONFIG GET (%s), so whether it keeps "
            "parked runs (tasks %s) across a restart is unknown; %s",
            exc,
            ", ".join(parking),
            _REMEDY,
        )
        return
    except transport.UNREACHABLE:
        return  # the start-up ping says so
    except Exception:
        logger.exception("celery_redislock: could not read the lock store's persistence")
        return
    found = verdict(appendonly, save)
    if found is not None and rated:
        logger.warning(
            "celery_redislock: the lock store %s: the state of the rate limits of tasks "
            "%s is lost when it restarts, and runs that come next may start beyond their "
            "limit for up to one period",
            "saves RDB snapshots only" if save.strip() else "keeps no data on disk",
            ", ".join(rated),
        )
    if found is not None and parking:
        logger.warning(
            "celery_redislock: %s (tasks that park: %s); %s",
            found,
            ", ".join(parking),
            _REMEDY,
        )


def _config_get(client: Any, name: str) -> str:
    reply = client.config_get(name)
    value = reply.get(name, reply.get(name.encode(), "")) if isinstance(reply, dict) else ""
    return decode(value)
