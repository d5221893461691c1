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

import fnmatch
import logging
import time
import weakref
from typing import Any, Optional

from celery import current_app
from celery.signals import before_task_publish

from .. import _spelling, config
from ..exceptions import ConfigurationError
from . import parking, policies, startup
from .locked_task import OPTIONS, SHAPE_OPTIONS, LockedTask, prepare

__all__ = ["ConfiguredLocks", "describe", "match", "rules", "unmatched"]

logger = logging.getLogger("celery_redislock")

SETTING = "redislock_tasks"
#: Globbing characters of fnmatch patterns.
_GLOB = frozenset("*?[")


class ConfiguredLocks:
    """A Celery task annotation that locks the tasks ``redislock_tasks`` names.

    Put an instance in ``task_annotations`` (a list may hold other annotations
    too; this one never returns attributes, so theirs still apply).
    """

    def __init__(self) -> None:
        before_task_publish.connect(_stamp, weak=False, dispatch_uid="celery_redislock.configured")

    def annotate(self, task: Any) -> None:
        """Called by Celery for each task class as it binds to its app."""
        app = task._app
        startup.install(app)
        found = match(app, task.name)
        if found is not None:
            adopt(task, *found)

    def __repr__(self) -> str:
        return "celery_redislock.ConfiguredLocks()"


#: app -> the ``redislock_tasks`` dict last checked for it (checked once, not
#: on every task bind and every publish).
_checked: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = weakref.WeakKeyDictionary()


def rules(app: Any) -> dict[str, dict[str, Any]]:
    """``redislock_tasks`` of ``app``, checked: pattern -> options."""
    conf = app.conf
    raw = conf.get(SETTING)
    if raw is None:
        return {}
    checked = _checked.get(app)
    if checked is not None and checked is raw:
        return checked
    where = _spelling.spelled(conf, SETTING)
    if not isinstance(raw, dict):
        raise ConfigurationError(
            f"{where} must be a dict of task-name pattern -> options, got {raw!r}"
        )
    valid = (*SHAPE_OPTIONS, *OPTIONS)
    for pattern, options in raw.items():
        if not isinstance(pattern, str) or not pattern:
            raise ConfigurationError(f"{where}: a pattern must be a task name or glob: {pattern!r}")
        if not isinstance(options, dict):
            raise ConfigurationError(
                f"{where}[{pattern!r}] must be a dict of LockedTask options, got {options!r}"
            )
        for option, value in options.items():
            if option not in valid:
                raise ConfigurationError(
                    f"{where}[{pattern!r}]: unknown option {option}={value!r}"
                    + _spelling.suggestion(str(option), valid)
                )
            if option in OPTIONS:
                config.validate(OPTIONS[option], value, f"{where}[{pattern!r}]: option {option}")
    _checked[app] = raw
    return raw


def match(app: Any, name: str) -> Optional[tuple[str, dict[str, Any]]]:
    """(pattern, options) of the most specific pattern matching task ``name``."""
    table = rules(app)
    if name in table:
        return name, table[name]
    globs = sorted(
        (p for p in table if _GLOB & set(p) and fnmatch.fnmatchcase(name, p)),
        key=len,
        reverse=True,
    )
    if not globs:
        return None
    if len(globs) > 1 and len(globs[0]) == len(globs[1]):
        where = _spelling.spelled(app.conf, SETTING)
        raise ConfigurationError(
            f"{where}: task {name!r} matches both {globs[0]!r} and {globs[1]!r}, "
            "equally specific; name the task exactly or make one pattern longer"
        )
    return globs[0], table[globs[0]]


def adopt(cls: Any, pattern: str, options: dict[str, Any]) -> None:
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
    for option, value in options.items():
        if getattr(cls, option, None) is None:
            setattr(cls, option, value)
    cls._redislock_source = f"{SETTING}[{pattern!r}]"
    try:
        prepare(cls, cls.name)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from exc


def unmatched(app: Any) -> list[str]:
    """Patterns of ``redislock_tasks`` that match no task registered in ``app``."""
    names = list(app.tasks)
    return [p for p in rules(app) if p not in names and not fnmatch.filter(names, p)]


def describe(app: Any) -> str:
    """One line: which tasks of ``app`` are locked, and how."""
    parts = []
    for name in sorted(app.tasks):
        task = app.tasks[name]
        if not isinstance(task, LockedTask):
            continue
        shown = {o: getattr(task, o) for o in (*SHAPE_OPTIONS, "on_contention", "lock_ttl")}
        shown = {o: v for o, v in shown.items() if v is not None}
        how = ", ".join(f"{o}={v!r}" for o, v in shown.items())
        source = getattr(task, "_redislock_source", "code")
        parts.append(f"{name} ({how}{'; ' if how else ''}from {source})")
    return "; ".join(parts) or "none"


def _stamp(sender: Any = None, headers: Any = None, **_: Any) -> None:
    """A configured task sent by name still gets its park order stamp."""
    if not isinstance(headers, dict):
        return
    name = headers.get("task") or sender
    if not isinstance(name, str) or parking.SENT_HEADER in headers:
        return
    app = current_app._get_current_object()  # (the proxy cannot be weakly referenced)
    try:
        found = match(app, name)
    except ConfigurationError:
        return  # reported where it matters: the worker refuses to start
    if found is None:
        return
    per_call = headers.get(policies.CALL_OPTIONS_HEADER) or {}
    policy = per_call.get("on_contention") or found[1].get("on_contention")
    if policy is None:
        policy = config.settings_for(app).on_contention
    if policy == "park":
        headers[parking.SENT_HEADER] = round(time.time() * 1000, 3)
