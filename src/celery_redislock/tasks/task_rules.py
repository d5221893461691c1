"""The ``redislock_tasks`` setting: task-name patterns and the options they give.

Precedence: an exact name beats a glob, and a longer glob beats a shorter
one; two globs of the same length that both match a task are a
ConfigurationError naming both.  Read by the task side
(:mod:`celery_redislock.tasks.configured`), the worker's start checks and
``send_task`` by name (:mod:`celery_redislock.unique.sender`).
"""

from __future__ import annotations

import fnmatch
import weakref
from typing import Any, Optional

from .. import _spelling
from ..exceptions import ConfigurationError
from . import options

__all__ = ["SETTING", "match", "options_of", "rules", "unmatched"]

SETTING = "redislock_tasks"
#: Globbing characters of fnmatch patterns.
_GLOB = frozenset("*?[")

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
    for pattern, opts in raw.items():
        if not isinstance(pattern, str) or not pattern:
            raise ConfigurationError(f"{where}: a pattern must be a task name or glob: {pattern!r}")
        if not isinstance(opts, dict):
            raise ConfigurationError(
                f"{where}[{pattern!r}] must be a dict of LockedTask options, got {opts!r}"
            )
        for option, value in opts.items():
            if option not in options.VALID:
                raise ConfigurationError(
                    f"{where}[{pattern!r}]: unknown option {option}={value!r}"
                    + _spelling.suggestion(str(option), options.VALID)
                )
            options.check_run_option(option, value, f"{where}[{pattern!r}]: option {option}")
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


def unmatched(app: Any) -> list[str]:
    """Patterns of ``redislock_tasks`` that match no task registered in ``app``."""
    names = list(app.tasks)
    return [p for p in rules(app) if p not in names and not fnmatch.filter(names, p)]


def options_of(app: Any, name: str) -> Optional[dict[str, Any]]:
    """The options ``redislock_tasks`` gives task ``name``, or None."""
    found = match(app, name)
    return None if found is None else found[1]
