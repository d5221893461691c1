"""The lock store's reachability, checked once as a worker starts.

A worker starts even when its lock store does not answer: in many
deployments Celery workers come up before their Redis.  But it says so, in
one ERROR line naming the store (never its password) and what every locked
run will do until the store answers, as ``redislock_on_redis_error`` says:
be re-sent up to ``redislock_redis_error_retries`` times and then fail, fail
at once, or run without a lock.  When the store answers, one INFO line names
it as reached.

The ping is bounded by :data:`BOUND` whatever the client's own retry policy
(a client from ``redislock_client`` may retry for long): it runs in a thread
of its own, and a ping that has not answered by then counts as unreachable.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from .. import config
from .locked_task import LockedTask

__all__ = ["BOUND", "check_store", "what_runs_do"]

logger = logging.getLogger("celery_redislock")

#: The longest the start-up ping may take, seconds (the client's connect
#: timeout is ``min(redislock_socket_timeout, 5)``).
BOUND = 5.0


def check_store(app: Any, settings: config.Settings) -> bool:
    """Ping ``app``'s lock store; log INFO when it answers, else one ERROR
    saying what locked runs will do.  Returns whether it answered."""
    _, source = config.store(app.conf)
    store = f"{config.describe_store(settings)} (from {source})"
    bound = min(settings.socket_timeout, BOUND)
    error = _ping(app, bound)
    if error is None:
        logger.info("celery_redislock: lock store %s, reached", store)
        return True
    logger.error(
        "celery_redislock: lock store %s is unreachable (%s); the worker starts anyway, "
        "and until the store answers %s",
        store,
        error,
        what_runs_do(app, settings),
    )
    return False


def _ping(app: Any, bound: float) -> Optional[str]:
    """None when the store answered PING within ``bound`` seconds, else what went wrong."""
    outcome: list[Optional[str]] = []

    def ping() -> None:
        try:
            config.client_for(app).ping()
        except Exception as exc:  # any error: the store cannot serve locks
            outcome.append(f"{type(exc).__name__}: {exc}")
        else:
            outcome.append(None)

    # A daemon thread: a ping stuck on a paused server must not hold the
    # worker's start, nor its exit.
    thread = threading.Thread(target=ping, name="redislock-store-check", daemon=True)
    thread.start()
    thread.join(bound + 0.5)
    if not outcome:
        return f"no answer to PING within {bound:g} s"
    return outcome[0]


def what_runs_do(app: Any, settings: config.Settings) -> str:
    """What each run of a locked task does while the store is unreachable, in
    words, as the settings say; tasks that set their own policy are named."""
    said = _policy(settings.on_redis_error, settings.redis_error_retries, settings)
    said += f" (redislock_on_redis_error={settings.on_redis_error!r})"
    usual = _policy(settings.on_redis_error, settings.redis_error_retries, settings, short=True)
    own = []
    for name in sorted(app.tasks):
        task = app.tasks[name]
        if not isinstance(task, LockedTask):
            continue
        retries = task.lock_redis_error_retries
        if retries is None:
            retries = settings.redis_error_retries
        policy = task.lock_on_redis_error or settings.on_redis_error
        does = _policy(policy, retries, settings, short=True)
        if does != usual:
            own.append(f"{name} {does}")
    if own:
        said += "; but " + ", ".join(own)
    return said


def _policy(
    policy: str, retries: Optional[int], settings: config.Settings, short: bool = False
) -> str:
    runs = "" if short else "each run of a locked task "
    if policy == "fail":
        return f"{runs}fails at once with BackendUnavailable"
    if policy == "run":
        return f"{runs}runs its body WITHOUT a lock"
    backoff = f"{settings.lock_retry_backoff:g}-{settings.lock_retry_backoff_max:g} s apart"
    if retries is None:
        return f"{runs}is re-sent, {backoff}, with no limit"
    return f"{runs}is re-sent up to {retries} times, {backoff}, then fails with BackendUnavailable"
