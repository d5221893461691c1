"""What an app using the library checks when it finalizes and when a worker starts.

``install(app)`` runs when a LockedTask binds to an app (as the app
finalizes): it validates every ``redislock_*`` setting, so a bad one stops
the app, and adds :class:`WorkerStep` to the app's worker blueprint.  The
step runs as a worker starts, before it takes any message: it refuses to
start without a Redis lock store, logs which store it uses (without the
password) and which tasks are locked, and warns about ``redislock_tasks``
patterns that match no task.  A bootstep, not a signal handler: Celery logs and swallows what
signal handlers raise, and a worker with a bad configuration must not start.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from celery import bootsteps

from .. import config

__all__ = ["WorkerStep", "install"]

logger = logging.getLogger("celery_redislock")

_installed: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def install(app: Any) -> None:
    """Validate ``app``'s settings now and check its lock store at worker start (idempotent)."""
    config.settings_for(app)  # raises ConfigurationError on a bad setting
    with _lock:
        if app in _installed:
            return
        _installed.add(app)
        app.steps["worker"].add(WorkerStep)


class WorkerStep(bootsteps.Step):  # type: ignore[misc]
    """Checks the settings and the lock store as the worker starts."""

    name = "celery_redislock"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        app = worker.app
        config.reset(app)  # read app.conf as it is now, after every override
        settings = config.settings_for(app)
        if settings.url is None:
            raise config.no_store(app.conf)
        _, source = config.store(app.conf)
        logger.info(
            "celery_redislock: lock store %s (from %s)",
            config.describe_store(settings.url),
            source,
        )
        from . import configured  # (imports this module)

        for pattern in configured.unmatched(app):
            logger.warning(
                "celery_redislock: %s pattern %r matches no registered task (a typo?)",
                configured.SETTING,
                pattern,
            )
        logger.info("celery_redislock: locked tasks: %s", configured.describe(app))
        super().__init__(worker, **kwargs)
