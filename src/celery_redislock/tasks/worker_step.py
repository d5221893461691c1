"""The worker step: checks the settings and the lock store as a worker starts.

It runs before the worker takes any message: it refuses to start without a
Redis lock store, or with ``redislock_tasks`` set while no
:class:`~celery_redislock.ConfiguredLocks` is in ``task_annotations`` (its
patterns would silently lock nothing); it logs which store it uses (without
the password) and whether it answers (:mod:`.store_check`: it starts anyway,
saying what locked runs will do), which tasks are locked, and warns about
``redislock_tasks`` patterns that match no task.  A bootstep, not a signal
handler: Celery logs and swallows what signal handlers raise, and a worker
with a bad configuration must not start.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from .. import config
from . import configured, durability, store_check
from .task_rules import SETTING

__all__ = ["WorkerStep"]

logger = logging.getLogger("celery_redislock")


class WorkerStep(bootsteps.Step):  # type: ignore[misc]
    """Checks the settings and the lock store as the worker starts."""

    name = "celery_redislock"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        app = worker.app
        config.reset(app)  # read app.conf as it is now, after every override
        settings = config.require_store(app)  # a URL, or redislock_client
        configured.check_annotated(app)
        store_check.check_store(app, settings)  # logs the store: reached, or what runs will do
        for pattern in configured.unmatched(app):
            logger.warning(
                "celery_redislock: %s pattern %r matches no registered task (a typo?)",
                SETTING,
                pattern,
            )
        logger.info("celery_redislock: locked tasks: %s", configured.describe(app))
        durability.check_durability(app, settings)  # warns when parked runs could be lost
        super().__init__(worker, **kwargs)
