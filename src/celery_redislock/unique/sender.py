"""``send_task`` by name follows the unique-job options of ``redislock_tasks``.

``task.apply_async`` applies a LockedTask's unique-job policy itself.  A
producer that sends a task by name (``app.send_task("proj.sync", ...)``, or
beat for a task it has not imported) has no task object whose
``apply_async`` would run: :func:`install` wraps the app's ``send_task`` so
that such a publish follows the policy too.  A name the app knows as a
LockedTask is published through that task (its signature names the
arguments); any other name that a ``redislock_tasks`` pattern gives unique
options is published with those options, its key built from the keyword
arguments (a key naming a positional parameter then needs the task's
signature: a ConfigurationError says so).  Every other publish goes
straight through, as does a publish from ``apply_async`` (which names its
task type).

A publish can still pass by the wrapper: the very first one of a process
whose configuration (and so :class:`~celery_redislock.ConfiguredLocks`, which
installs the wrapper) loads during that send.  :func:`bypassed`, called from
``before_task_publish``, catches it: it takes the job's key there, and as a
signal cannot stop the message, marks a duplicate to end at once as a
FAILURE with AlreadyQueued, with a warning, rather than let it run twice.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Callable, Optional

from ..exceptions import ConfigurationError
from ..tasks.lock_keys import KeySpec
from ..tasks.messages import CALL_OPTIONS_HEADER, DUPLICATE_HEADER, UNIQUE_HEADER
from . import publish

__all__ = ["bypassed", "install"]

logger = logging.getLogger("celery_redislock")

_installed: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def install(app: Any, rules: Callable[[Any, str], Optional[dict[str, Any]]]) -> None:
    """Wrap ``app.send_task`` (once per app); ``rules(app, name)`` gives the
    ``redislock_tasks`` options of a task name, or None."""
    with _lock:
        if app in _installed:
            return
        _installed.add(app)
        original = app.send_task

        def send_task(name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
            if options.get("task_type") is None:
                sent = _by_name(app, rules, original, name, args, kwargs, options)
                if sent is not _THROUGH:
                    return sent
            return original(name, args, kwargs, **options)

        send_task.__doc__ = original.__doc__
        send_task.__wrapped__ = original  # type: ignore[attr-defined]
        app.send_task = send_task


#: _by_name's answer for a publish it leaves to Celery as it is.
_THROUGH = object()


def _by_name(
    app: Any,
    rules: Callable[[Any, str], Optional[dict[str, Any]]],
    original: Callable[..., Any],
    name: str,
    args: Any,
    kwargs: Any,
    options: dict[str, Any],
) -> Any:
    found = rules(app, name)
    if not (_unique(found) or _unique(publish.per_call_options(options))):
        return _THROUGH
    if not app.finalized and app.autofinalize:
        app.finalize(auto=True)  # as a task's first use does: its signature is then known
    task = app.tasks.get(name) if app.finalized else None
    if task is not None and hasattr(task, "unique_holder"):
        return task.apply_async(args, kwargs, **options)
    return _unregistered(app, original, name, args, kwargs, options, found or {})


def _unregistered(
    app: Any,
    original: Callable[..., Any],
    name: str,
    args: Any,
    kwargs: Any,
    options: dict[str, Any],
    found: dict[str, Any],
) -> Any:
    """A task this process does not know: its options come from ``redislock_tasks``."""
    options = dict(options)
    per_call = publish.per_call_options(options)
    pol = publish.policy_for(app, name, found, per_call)
    if pol is None:
        return original(name, args, kwargs, **options)
    part = _part(app, name, found, args, kwargs)

    def send(opts: dict[str, Any]) -> Any:
        return original(name, args, kwargs, **opts)

    return publish.publish(app, name, name, pol, part, options, send, app.AsyncResult)


def bypassed(
    app: Any, name: str, found: dict[str, Any], headers: dict[str, Any], body: Any
) -> None:
    """Check a configured unique job that reached ``before_task_publish``
    without passing the wrapper (nothing of ours in its ``headers``)."""
    if UNIQUE_HEADER in headers or DUPLICATE_HEADER in headers:
        return
    per_call = headers.get(CALL_OPTIONS_HEADER) or {}
    if not (_unique(found) or _unique(per_call)):
        return
    pol = publish.policy_for(app, name, found, per_call)
    task_id = headers.get("id")
    if pol is None or not isinstance(task_id, str):
        return
    if isinstance(body, (list, tuple)):  # protocol 2: (args, kwargs, embed)
        args, kwargs = body[0], body[1]
    else:
        args, kwargs = (body or {}).get("args"), (body or {}).get("kwargs")
    part = _part(app, name, found, args, kwargs)
    delay = publish.delay_of(app, headers.get("eta"))
    key, outcome = publish.take(app, name, pol, part, task_id, delay, again=False)
    if outcome.accepted:
        headers[UNIQUE_HEADER] = publish.claim_header(key, pol)
        return
    holder = outcome.other or ""
    logger.warning(
        "%s[%s]: published before its app's configuration was loaded, so past the "
        "unique-job check of send_task; it duplicates task %s and will end as "
        "AlreadyQueued without running",
        name,
        task_id,
        holder,
    )
    publish.announce(name, name, key, task_id, holder, "fail")
    headers[DUPLICATE_HEADER] = holder


def _part(app: Any, name: str, found: dict[str, Any], args: Any, kwargs: Any) -> str:
    """The unique key part of a task this process may not know: its
    ``redislock_tasks`` options, and its signature where the app has the task."""
    unique_key = found.get("unique_key")
    task = app.tasks.get(name) if app.finalized else None
    spec = KeySpec(
        name,
        getattr(task, "run", None),  # type: ignore[arg-type]  # None: keyword arguments only
        found.get("lock_key") if unique_key is None else unique_key,
        option="lock_key" if unique_key is None else "unique_key",
    )
    _check_keywords(name, spec, args)
    return spec.key(args or (), kwargs or {})


def _check_keywords(name: str, spec: KeySpec, args: Optional[Sequence[Any]]) -> None:
    if args and spec.params and spec.signature is None:
        raise ConfigurationError(
            f"task {name!r}: send_task by name cannot tell which positional argument is "
            f"{', '.join(spec.params)} ({spec.option}={spec.lock_key!r}) without the task's "
            "signature: pass them as keyword arguments, or import the task in this process"
        )


def _unique(options: Any) -> bool:
    """Whether ``options`` (a pattern's, or a call's) ask for any uniqueness."""
    return bool(options) and any(
        options.get(o) is not None for o in ("unique", "debounce", "throttle")
    )
