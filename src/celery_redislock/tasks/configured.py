"""Locking configured by task name: ``redislock_tasks`` in the app's configuration.

::

    # celeryconfig.py
    from celery_redislock import ConfiguredLocks

    task_annotations = [ConfiguredLocks()]
    redislock_tasks = {
        "proj.billing.charge": {"lock_key": ["customer_id"], "on_contention": "park"},
        "proj.reports.*": {"on_contention": "skip", "lock_ttl": 120},
    }

The mechanism is Celery's task annotations (``task_annotations``,
celery/app/annotations.py): Celery asks every annotation object about every
task class as that class binds to its app (``Task.bind`` calls
``annotate()`` once per class, before the app hands out the task), whether
the task came from ``@app.task``, ``@shared_task``, ``register_task`` or a
module the project does not own.  For a task whose name matches,
:class:`ConfiguredLocks` puts :class:`~celery_redislock.LockedTask` first
among the class's bases and sets the configured options on the class where
its code set none, then checks them as a ``base=LockedTask`` declaration is
checked.

Why this gives the guarantees of the base class: the task class *is* then a
LockedTask subclass, with the same method resolution order as a task declared
``base=LockedTask`` on top of its own base.  The same ``__call__`` takes the
lock and releases it exactly once on every outcome (success, exception,
``retry()``, ``Ignore``, ``Reject``, a soft time limit); the same ``retry`` and
``replace`` release before publishing; the same ``Request`` class (combined
with a request class of the task's own base, if it has one) frees a killed
child's lock in the worker's main process after a hard time limit or
``revoke(terminate=True)``; the same policy code skips, retries, waits, fails
or parks.  Nothing depends on a signal handler's exception reaching Celery.

The one thing a consumer cannot do for a producer is stamp a message as it
is sent: a parked run's place in line is its publish time.  A producer that
sends a task by name (``send_task``) without importing its module has no
task class to bind, so creating :class:`ConfiguredLocks` (at configuration
load, in every process that loads the config) also connects a
``before_task_publish`` receiver that stamps the messages of configured
tasks.

Precedence: options in code win over ``redislock_tasks``; among patterns, an
exact name beats a glob, and a longer glob beats a shorter one; two globs of
the same length that both match a task are a ConfigurationError naming both.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import current_app
from celery.signals import before_task_publish

from .. import _spelling, config
from ..exceptions import ConfigurationError
from ..unique import sender as unique_sender
from . import messages, parking, startup
from .locked_task import LockedTask
from .options import SHAPE_OPTIONS
from .prepare import prepare
from .task_rules import SETTING, match, options_of, rules, unmatched

#: The unique-job options the worker's start line shows.
UNIQUE_SHOWN = ("unique", "unique_key", "debounce", "throttle", "on_duplicate")

__all__ = [
    "ConfiguredLocks",
    "annotated",
    "check_annotated",
    "describe",
    "match",
    "rules",
    "unmatched",
]

logger = logging.getLogger("celery_redislock")


class ConfiguredLocks:
    """A Celery task annotation that locks the tasks ``redislock_tasks`` names.

    Put an instance in ``task_annotations`` (a list may hold other annotations
    too; this one never returns attributes, so theirs still apply).
    """

    def __init__(self) -> None:
        before_task_publish.connect(_stamp, weak=False, dispatch_uid="celery_redislock.configured")
        # A producer that only sends configured tasks by name may never
        # finalize its app (so never binds a task, where this happens too):
        # the app loading this configuration is the current one.
        unique_sender.install(current_app._get_current_object(), options_of)

    def annotate(self, task: Any) -> None:
        """Called by Celery for each task class as it binds to its app."""
        app = task._app
        startup.install(app)
        found = match(app, task.name)
        if found is not None:
            adopt(task, *found)

    def __repr__(self) -> str:
        return "celery_redislock.ConfiguredLocks()"


def adopt(cls: Any, pattern: str, opts: dict[str, Any]) -> None:
    """Make task class ``cls`` a LockedTask with ``options`` where its code set none."""
    where = f"{_spelling.spelled(cls._app.conf, SETTING)}[{pattern!r}]"
    if not issubclass(cls, LockedTask):
        try:
            cls.__bases__ = (LockedTask, *cls.__bases__)
        except TypeError as exc:  # a layout Python cannot combine
            raise ConfigurationError(
                f"{where}: task {cls.name!r} ({cls.__qualname__}) cannot be made a "
                f"LockedTask: {exc}; declare it with base=LockedTask"
            ) from exc
    for option, value in opts.items():
        if getattr(cls, option, None) is None:
            setattr(cls, option, value)
    cls._redislock_source = f"{SETTING}[{pattern!r}]"
    try:
        prepare(cls, cls.name, LockedTask)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from exc


def annotated(app: Any) -> bool:
    """Whether ``task_annotations`` of ``app`` holds a ConfiguredLocks (an
    instance, or the dotted name of the class, which Celery instantiates)."""
    found = app.conf.get("task_annotations")
    items = found if isinstance(found, (list, tuple)) else [found]
    for item in items:
        if isinstance(item, ConfiguredLocks):
            return True
        if isinstance(item, str) and item.replace(":", ".").rsplit(".", 1)[-1] == (
            ConfiguredLocks.__name__
        ):
            return True
    return False


def check_annotated(app: Any) -> None:
    """Refuse ``redislock_tasks`` without a ConfiguredLocks in ``task_annotations``:
    Celery would never ask it about any task, and no pattern would apply."""
    if not rules(app) or annotated(app):
        return
    where = _spelling.spelled(app.conf, SETTING)
    raise ConfigurationError(
        f"{where} is set, but task_annotations has no celery_redislock.ConfiguredLocks(), "
        "so none of its patterns lock anything: add "
        "task_annotations = [ConfiguredLocks()] to the same configuration"
    )


def describe(app: Any) -> str:
    """One line: which tasks of ``app`` are locked, and how."""
    parts = []
    for name in sorted(app.tasks):
        task = app.tasks[name]
        if not isinstance(task, LockedTask):
            continue
        shown = {
            o: getattr(task, o)
            for o in (*SHAPE_OPTIONS, "on_contention", "lock_ttl", *UNIQUE_SHOWN)
        }
        shown = {o: v for o, v in shown.items() if v is not None}
        how = ", ".join(f"{o}={v!r}" for o, v in shown.items())
        source = getattr(task, "_redislock_source", "code")
        parts.append(f"{name} ({how}{'; ' if how else ''}from {source})")
    return "; ".join(parts) or "none"


def _stamp(sender: Any = None, headers: Any = None, body: Any = None, **_: Any) -> None:
    """A configured task sent by name still gets its park order stamp, and a
    unique job that passed by the send_task wrapper its check."""
    if not isinstance(headers, dict):
        return
    name = headers.get("task") or sender
    if not isinstance(name, str):
        return
    app = current_app._get_current_object()  # (the proxy cannot be weakly referenced)
    try:
        found = match(app, name)
    except ConfigurationError:
        return  # reported where it matters: the worker refuses to start
    if found is None:
        return
    per_call = headers.get(messages.CALL_OPTIONS_HEADER) or {}
    policy = per_call.get("on_contention") or found[1].get("on_contention")
    if policy is None:
        policy = config.settings_for(app).on_contention
    if policy == "park" and parking.SENT_HEADER not in headers:
        headers[parking.SENT_HEADER] = round(time.time() * 1000, 3)
    unique_sender.bypassed(app, name, found[1], headers, body)
