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

from .. import _validate
from ..exceptions import ConfigurationError
from ..primitives import Kind, Lock, Mode, Primitive, Semaphore
from ..primitives.rwlock import Side

__all__ = ["LOCK_MODES", "build", "check_options", "group_limit", "kind_of", "target"]

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
    where = f"task {task_name!r}: option"
    _validate.check_count(semaphore, f"{where} semaphore", optional=True)
    if mode is not None:
        _validate.check_choice(mode, f"{where} lock_mode", LOCK_MODES)
    if group is not None:
        _validate.check_name(group, f"{where} concurrency_group")
        if groups is not None:
            group_limit(task_name, group, groups)


def group_limit(task_name: str, group: str, groups: dict[str, int]) -> int:
    """The limit of ``group`` in ``redislock_semaphores``; an unknown group raises."""
    limit: int = _validate.named(
        f"task {task_name!r}: concurrency_group", group, groups, "redislock_semaphores"
    )
    return limit


def target(task: Any, args: Any, kwargs: Any) -> tuple[str, Kind]:
    """(name, kind) of the primitive guarding this call."""
    part = task.lock_key_for(args, kwargs)
    if task.concurrency_group is not None:
        base = f"group:{task.concurrency_group}"
    else:
        base = task.lock_name or task.name
    name = f"{base}:{part}" if part else base
    if task.semaphore is not None or task.concurrency_group is not None:
        return name, Kind.SEMAPHORE
    if task.lock_mode is not None:
        return name, Kind.RWLOCK
    return name, Kind.LOCK


def kind_of(task: Any) -> Kind:
    """The kind of primitive guarding every run of ``task`` (the rule
    :func:`target` applies inline, on a run's hot path)."""
    if task.semaphore is not None or task.concurrency_group is not None:
        return Kind.SEMAPHORE
    if task.lock_mode is not None:
        return Kind.RWLOCK
    return Kind.LOCK


def build(
    task: Any, name: str, kind: Kind, client: Any, limits: dict[str, int], **options: Any
) -> Primitive:
    """The primitive object for one run."""
    ttl = options.pop("ttl")
    if kind is Kind.SEMAPHORE:
        if task.concurrency_group is not None:
            limit = group_limit(task.name, task.concurrency_group, limits)
            return Semaphore(client, name, limit, ttl, **options)
        return Semaphore(client, name, task.semaphore, ttl, **options)
    if kind is Kind.RWLOCK:
        mode = Mode.READ if task.lock_mode == "read" else Mode.WRITE
        return Side(client, name, mode, ttl, **options)
    return Lock(client, name, ttl, **options)
