"""What an app using the library checks when it finalizes and when a worker starts.

``install(app)`` runs when a LockedTask binds to an app (as the app
finalizes) and when :class:`~celery_redislock.ConfiguredLocks` annotates a
task: it validates every ``redislock_*`` setting, so a bad one stops the
app; it adds the worker step (:mod:`celery_redislock.tasks.worker_step`,
by name) to the app's worker blueprint, which checks the lock store as a
worker starts; and it lets ``send_task`` by name follow the unique-job
options (:mod:`celery_redislock.unique.sender`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .. import config
from ..unique import sender
from . import task_rules

__all__ = ["WORKER_STEP", "install"]

#: The worker step, by name: the blueprint imports it as the worker starts.
WORKER_STEP = "celery_redislock.tasks.worker_step:WorkerStep"

_installed: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def install(app: Any) -> None:
    """Validate ``app``'s settings now and check its lock store at worker start (idempotent)."""
    config.settings_for(app)  # raises ConfigurationError on a bad setting
    with _lock:
        if app in _installed:
            return
        _installed.add(app)
        app.steps["worker"].add(WORKER_STEP)
    sender.install(app, task_rules.options_of)
