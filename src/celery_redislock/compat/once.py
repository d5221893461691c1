"""``QueueOnce``: celery-once's task base class, over unique jobs.

``once={'keys': [...], 'graceful': bool, 'timeout': s, 'unlock_before_run':
bool}`` on the task (``graceful`` and ``timeout`` per call too), and
``app.conf.ONCE = {'backend': ..., 'settings': {'url': ..., 'default_timeout':
s}}``, mean what they mean to celery-once; the keys, their lifecycle and the
fixes are :mod:`celery_redislock.unique`'s.
"""

from __future__ import annotations

from typing import Any, Optional

from celery import states
from celery.result import EagerResult

from .. import exceptions
from ..exceptions import ConfigurationError
from .base import PeerTask, follow_store, keys_of, timeout_of

__all__ = ["AlreadyQueued", "QueueOnce"]

#: celery-once's option names, on the task and per call.
OPTIONS = ("keys", "graceful", "timeout", "unlock_before_run")
CALL_OPTIONS = ("graceful", "timeout")
#: ``ONCE['backend']`` values naming celery-once's Redis backend.
REDIS_BACKENDS = ("celery_once.backends.Redis", "celery_once.backends.redis.Redis")
#: celery-once's timeout when ``ONCE['settings']`` names none.
DEFAULT_TIMEOUT = 60 * 60


class AlreadyQueued(exceptions.AlreadyQueued):
    """celery-once's duplicate: ``countdown`` seconds until the key frees at most,
    ``message``; a :class:`celery_redislock.exceptions.AlreadyQueued` too (``key``,
    ``task_id`` of the job holding it, ``ttl_ms``)."""

    def __init__(
        self,
        countdown: float,
        key: str = "",
        task_id: Optional[str] = None,
        ttl_ms: Optional[int] = None,
    ) -> None:
        self.countdown = countdown
        self.message = f"Expires in {countdown} seconds"
        super().__init__(self.message, key, task_id, ttl_ms)
        self.args = (countdown, key, task_id, ttl_ms)


class QueueOnce(PeerTask):
    """celery-once's ``QueueOnce``: a duplicate publish raises AlreadyQueued
    (or, ``graceful``, returns a result with id None in state REJECTED)."""

    once: dict[str, Any] = {"graceful": False, "unlock_before_run": False}
    on_duplicate = "raise"
    foreign_options = ("once",)

    @classmethod
    def _translate(cls, own: dict[str, Any]) -> None:
        once = own.get("once", getattr(cls, "once", {}))
        name = cls.__dict__.get("name") or cls.__qualname__
        where = f"task {name!r}: option once"
        if not isinstance(once, dict):
            raise ConfigurationError(f"{where}={once!r} must be a dict")
        unknown = sorted(set(once) - set(OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"{where} has unknown key(s) {unknown!r}; celery-once's are {list(OPTIONS)!r}"
            )
        timeout = timeout_of(once.get("timeout"), f"{where}['timeout']")
        if timeout is not None and "unique_ttl" not in cls.__dict__:
            cls.unique_ttl = timeout
        if once.get("unlock_before_run") and "unique" not in cls.__dict__:
            cls.unique = "until_started"
        if "once" in own or "run" in cls.__dict__:
            cls._set_key(keys_of(once.get("keys"), f"{where}['keys']"))

    @classmethod
    def bind(cls, app: Any) -> Any:
        once = app.conf.get("ONCE") or {}
        settings = once.get("settings") or {}
        backend = once.get("backend")
        if (
            backend
            and backend not in REDIS_BACKENDS
            and not (app.conf.get("redislock_url") or app.conf.get("redislock_client"))
        ):
            raise ConfigurationError(
                f"ONCE['backend']={backend!r}: QueueOnce keeps its keys in a Redis lock "
                "store; set ONCE['settings']['url'] with celery_once's Redis backend, "
                "or redislock_url"
            )
        follow_store(app, settings.get("url"), "ONCE['settings']['url']")
        default = timeout_of(
            settings.get("default_timeout", DEFAULT_TIMEOUT), "ONCE['settings']['default_timeout']"
        )
        cls._compat_timeout = timeout_of(cls.once.get("timeout"), "once['timeout']") or default
        if cls.unique_ttl is None:
            cls.unique_ttl = cls._compat_timeout
        return super().bind(app)

    @property
    def once_config(self) -> Any:
        """``app.conf.ONCE``."""
        return self.app.conf.ONCE

    @property
    def default_timeout(self) -> Any:
        """``ONCE['settings']['default_timeout']``, one hour by default."""
        return self.once_config["settings"].get("default_timeout", DEFAULT_TIMEOUT)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Celery's ``apply_async``, plus ``once={'graceful': ..., 'timeout': ...}``."""
        once = options.pop("once", None) or {}
        unknown = sorted(set(once) - set(CALL_OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"task {self.name!r}: once={once!r} per call takes {list(CALL_OPTIONS)!r}"
            )
        graceful = once.get("graceful", self.once.get("graceful", False))
        timeout = self._compat_timeout
        if "timeout" in once:
            timeout = timeout_of(once["timeout"], f"task {self.name!r}: once['timeout']")
            options["redislock"] = {"unique_ttl": timeout, **(options.get("redislock") or {})}
        if self.unique == "until_finished":
            self._deadline_headers(options, timeout)
        try:
            return super().apply_async(args, kwargs, **options)
        except exceptions.AlreadyQueued as exc:
            if isinstance(exc, AlreadyQueued):
                raise
            if graceful:
                return EagerResult(None, None, states.REJECTED)
            countdown = exc.ttl_ms / 1000.0 if exc.ttl_ms is not None else float(timeout or 0)
            raise AlreadyQueued(countdown, exc.key, exc.task_id, exc.ttl_ms) from None
