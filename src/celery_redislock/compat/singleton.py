"""``Singleton``: celery-singleton's task base class, over unique jobs.

``unique_on``, ``raise_on_duplicate`` and ``lock_expiry`` on the task, and
the ``singleton_backend_url``, ``singleton_raise_on_duplicate`` and
``singleton_lock_expiry`` settings, mean what they mean to celery-singleton;
the keys, their lifecycle and the fixes are :mod:`celery_redislock.unique`'s.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .. import exceptions
from ..exceptions import ConfigurationError
from ..ops.inspect import Inspector
from .base import PeerTask, follow_store, keys_of, timeout_of

__all__ = ["DuplicateTaskError", "Singleton", "clear_locks"]

logger = logging.getLogger("celery_redislock")

#: ``singleton_backend_class`` values naming celery-singleton's Redis backend.
REDIS_BACKENDS = ("celery_singleton.backends.redis.RedisBackend",)


class DuplicateTaskError(exceptions.AlreadyQueued):
    """celery-singleton's duplicate (``raise_on_duplicate``): ``task_id`` is the
    job holding the key; a :class:`celery_redislock.exceptions.AlreadyQueued` too."""

    def __init__(
        self, message: str, task_id: Optional[str], key: str = "", ttl_ms: Optional[int] = None
    ) -> None:
        super().__init__(message, key, task_id, ttl_ms)
        self.args = (message, task_id, key, ttl_ms)


def backend_url(conf: Any) -> tuple[Optional[str], str]:
    """Where celery-singleton keeps its locks: ``singleton_backend_url``, else the
    result backend when it is ``redis://``, else the broker; (url, setting)."""
    url = conf.get("singleton_backend_url")
    if url is not None:
        return url, "singleton_backend_url"
    url = conf.get("result_backend")
    if url and isinstance(url, str) and url.startswith("redis://"):
        return url, "result_backend"
    url = conf.get("broker_url")
    if isinstance(url, str) and url.startswith(("redis://", "rediss://", "unix://")):
        return url, "broker_url"
    return None, ""


class Singleton(PeerTask):
    """celery-singleton's ``Singleton``: a duplicate publish returns the queued
    job's AsyncResult (or, ``raise_on_duplicate``, raises DuplicateTaskError)."""

    unique_on: Any = None
    raise_on_duplicate: Optional[bool] = None
    lock_expiry: Optional[float] = None
    foreign_options = ("unique_on", "raise_on_duplicate", "lock_expiry")
    #: The task chose on_duplicate itself (else raise_on_duplicate decides).
    _compat_own_on_duplicate = False

    @classmethod
    def _translate(cls, own: dict[str, Any]) -> None:
        name = cls.__dict__.get("name") or cls.__qualname__
        where = f"task {name!r}: option"
        expiry = timeout_of(
            own.get("lock_expiry", getattr(cls, "lock_expiry", None)), f"{where} lock_expiry"
        )
        if expiry is not None and "unique_ttl" not in cls.__dict__:
            cls.unique_ttl = expiry
        raise_on = own.get("raise_on_duplicate")
        if raise_on is not None and not isinstance(raise_on, bool):
            raise ConfigurationError(f"{where} raise_on_duplicate={raise_on!r} must be a bool")
        if "on_duplicate" in cls.__dict__:
            cls._compat_own_on_duplicate = True
        if "unique_on" in own or "run" in cls.__dict__:
            unique_on = own.get("unique_on", getattr(cls, "unique_on", None))
            cls._set_key(keys_of(unique_on or None, f"{where} unique_on"))

    @classmethod
    def bind(cls, app: Any) -> Any:
        conf = app.conf
        backend = conf.get("singleton_backend_class")
        if backend is not None and not (conf.get("redislock_url") or conf.get("redislock_client")):
            path = (
                backend if isinstance(backend, str) else f"{backend.__module__}.{backend.__name__}"
            )
            if path not in REDIS_BACKENDS:
                raise ConfigurationError(
                    f"singleton_backend_class={backend!r}: Singleton keeps its keys in a "
                    "Redis lock store; set singleton_backend_url or redislock_url"
                )
        follow_store(app, *backend_url(conf))
        expiry = cls.lock_expiry
        if expiry is None:
            expiry = conf.get("singleton_lock_expiry")
        cls._compat_timeout = timeout_of(expiry, "singleton_lock_expiry")
        if cls.unique_ttl is None and cls._compat_timeout is not None:
            cls.unique_ttl = cls._compat_timeout
        if not cls._compat_own_on_duplicate:
            raise_on = cls.raise_on_duplicate
            if raise_on is None:
                raise_on = bool(conf.get("singleton_raise_on_duplicate"))
            cls.on_duplicate = "raise" if raise_on else "return"
        return super().bind(app)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Celery's ``apply_async``; a duplicate returns the queued job's result,
        or raises DuplicateTaskError."""
        if self.unique == "until_finished":
            self._deadline_headers(options, self._compat_timeout)
        try:
            return super().apply_async(args, kwargs, **options)
        except exceptions.AlreadyQueued as exc:
            if isinstance(exc, DuplicateTaskError):
                raise
            raise DuplicateTaskError(
                f"Attempted to queue a duplicate of task ID {exc.task_id}",
                exc.task_id,
                exc.key,
                exc.ttl_ms,
            ) from None


def clear_locks(app: Any) -> list[str]:
    """Free the unique keys of every Singleton task of ``app`` (the names the
    store spells out: a name it keeps digested, over 200 characters or with
    braces, is freed with ``task.release_unique(*args)``).  Returns the names."""
    tasks = [t.name for t in app.tasks.values() if isinstance(t, Singleton)]
    if not tasks:
        return []
    inspector = Inspector.from_app(app)
    freed = []
    for entry in inspector.entries(kind="unique"):
        if any(entry.name == t or entry.name.startswith(f"{t}:") for t in tasks):
            inspector.release(entry.name, kind="unique")
            freed.append(entry.name)
    return freed
