"""Assertions on what a task's lock is doing, read from Redis as workers see it.

``assert_lock_held(task, *args, **kwargs)`` and ``assert_lock_free(...)``
find the primitive a call with these arguments runs under
(``task.lock_target_for``: a lock, a semaphore or a read-write lock) in the
app's lock store under the app's key prefix, through the public inspect API;
``current_fence`` reads the fencing counter of a name.  Celery and the
inspect API are imported on first call, not when the pytest plugin loads.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    from ..ops.entries import Entry, Kind

__all__ = ["assert_lock_free", "assert_lock_held", "current_fence", "lock_entry"]


def lock_entry(task: Any, *args: Any, **kwargs: Any) -> Optional[Entry]:
    """The inspect API's entry of the primitive guarding ``task(*args, **kwargs)``,
    or None when Redis has nothing of it (never taken, or long expired)."""
    from ..ops.inspect import Inspector

    name, kind = task.lock_target_for(args, kwargs)
    found = Inspector.from_app(task.app).show(name, kind.value)
    return found[0] if found else None


def _describe(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    name, kind = task.lock_target_for(args, kwargs)
    return f"the {kind.value} {name!r} of {task.name}(*{args!r}, **{kwargs!r})"


def assert_lock_held(task: Any, *args: Any, **kwargs: Any) -> Entry:
    """Fail unless some run holds the primitive of this call; return its entry
    (``holders`` says who: task ids, workers, fences, remaining ttl)."""
    entry = lock_entry(task, *args, **kwargs)
    if entry is None or not entry.held:
        raise AssertionError(f"{_describe(task, args, kwargs)} is free, expected held")
    return entry


def assert_lock_free(task: Any, *args: Any, **kwargs: Any) -> None:
    """Fail if any run holds the primitive of this call, naming the holders."""
    entry = lock_entry(task, *args, **kwargs)
    if entry is not None and entry.held:
        holders = ", ".join(f"{h.task_id or h.token} (fence {h.fence})" for h in entry.holders)
        raise AssertionError(f"{_describe(task, args, kwargs)} is held by {holders}, expected free")


def current_fence(
    client_or_app: Any,
    name: str,
    *,
    prefix: Optional[str] = None,
    kind: Union[str, Kind] = "lock",
) -> Optional[int]:
    """The fencing token of the latest grant of ``name`` (``kind`` "lock",
    "semaphore" or "rwlock"), or None when it was never granted (or its fence
    outlived ``redislock_fence_retention``).  Given a Celery app, its lock store
    and key prefix are used; given a redis-py client, ``prefix`` (default
    "redislock")."""
    from ..primitives import Kind as PrimitiveKind
    from ..primitives import keys

    if hasattr(client_or_app, "conf"):  # a Celery app
        from .. import config

        client = config.client_for(client_or_app)
        prefix = prefix or config.settings_for(client_or_app).key_prefix
    else:
        client = client_or_app
    prefix = prefix or "redislock"
    try:
        key = keys.of_kind(PrimitiveKind(str(kind)), prefix, name).fence
    except ValueError:
        raise ValueError(
            f"kind must be 'lock', 'semaphore' or 'rwlock', got {str(kind)!r}"
        ) from None
    value = client.get(key)
    return None if value is None else int(value)
