"""Which primitive guards one run of a LockedTask.

- default: a Lock named after the task (or ``lock_name``) and the call's key;
- ``semaphore=N``: a Semaphore of N permits under that name (so with
  ``lock_key``, N per key);
- ``concurrency_group="name"``: a Semaphore shared by every task naming the
  group, with its limit from ``redislock_semaphores`` in app.conf;
- ``lock_mode="read"`` / ``"write"``: a side of the ReadWriteLock under that
  name (tasks that share a dataset share a ``lock_name``).
"""

from __future__ import annotations

from typing import Any, Optional

from .exceptions import ConfigurationError
from .locks import Lock
from .primitive import Primitive
from .rwlock import _Side
from .semaphore import Semaphore

__all__ = ["LOCK_MODES", "build", "check_options", "target"]

LOCK_MODES = ("read", "write")


def check_options(
    task_name: str, semaphore: Any, group: Any, mode: Any, groups: Optional[dict[str, int]]
) -> None:
    """Validate the guard options of a task; ``groups`` None skips the group lookup."""
    chosen = [
        n
        for n, v in (("semaphore", semaphore), ("concurrency_group", group), ("lock_mode", mode))
        if v is not None
    ]
    if len(chosen) > 1:
        raise ConfigurationError(
            f"task {task_name!r}: options {' and '.join(chosen)} exclude each other; choose one"
        )
    if semaphore is not None and (
        isinstance(semaphore, bool) or not isinstance(semaphore, int) or semaphore < 1
    ):
        raise ConfigurationError(
            f"task {task_name!r}: option semaphore must be an int >= 1, got {semaphore!r}"
        )
    if mode is not None and mode not in LOCK_MODES:
        raise ConfigurationError(
            f"task {task_name!r}: option lock_mode must be 'read' or 'write', got {mode!r}"
        )
    if group is not None:
        if not isinstance(group, str) or not group:
            raise ConfigurationError(
                f"task {task_name!r}: option concurrency_group must be "
                f"a non-empty str, got {group!r}"
            )
        if groups is not None and group not in groups:
            known = ", ".join(sorted(groups)) or "none configured"
            raise ConfigurationError(
                f"task {task_name!r}: concurrency_group={group!r} is not in "
                f"redislock_semaphores ({known})"
            )


def target(task: Any, args: Any, kwargs: Any) -> tuple[str, Optional[str]]:
    """(name, kind) of the primitive guarding this call; kind None, "sem" or "rw"."""
    part = task.lock_key_for(args, kwargs)
    if task.concurrency_group is not None:
        base = f"group:{task.concurrency_group}"
    else:
        base = task.lock_name or task.name
    name = f"{base}:{part}" if part else base
    if task.semaphore is not None or task.concurrency_group is not None:
        return name, "sem"
    if task.lock_mode is not None:
        return name, "rw"
    return name, None


def build(
    task: Any, name: str, kind: Optional[str], client: Any, limits: dict[str, int], **options: Any
) -> Primitive:
    """The primitive object for one run."""
    ttl = options.pop("ttl")
    if kind == "sem":
        if task.concurrency_group is not None:
            limit = limits.get(task.concurrency_group)
            if limit is None:
                check_options(task.name, None, task.concurrency_group, None, limits)
            return Semaphore(client, name, int(limit or 1), ttl, **options)
        return Semaphore(client, name, task.semaphore, ttl, **options)
    if kind == "rw":
        return _Side(client, name, "r" if task.lock_mode == "read" else "x", ttl, **options)
    return Lock(client, name, ttl, **options)
