"""What both shims share: a LockedTask whose options come from a peer's options.

:class:`PeerTask` is a :class:`~celery_redislock.LockedTask` with
``unique="until_finished"`` and a run lock on the job's own key (never one
lock for the whole task, which would serialise every job).  Its subclasses
name the peer's options (``foreign_options``) and translate them
(``_translate``) before LockedTask checks the class; the lock store follows
the peer's setting (:func:`follow_store`), and a job's key lets go at the
peer's timeout even while it runs (:mod:`.deadline`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Optional

from .. import config
from ..exceptions import BackendUnavailable, ConfigurationError
from ..primitives import unique
from ..tasks.hold import Hold
from ..tasks.lock_keys import KeySpec, canonical
from ..tasks.locked_task import LockedTask
from ..tasks.messages import header
from . import deadline

__all__ = ["AllArguments", "PeerTask", "follow_store"]

logger = logging.getLogger("celery_redislock")

#: The store each app follows, and the setting naming it: (url, setting).
_followed: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()


def follow_store(app: Any, url: Optional[str], setting: str) -> None:
    """Make ``url`` (named by the peer's ``setting``) the app's lock store,
    unless ``redislock_url`` or ``redislock_client`` names one: those win."""
    conf = app.conf
    current = _followed.get(app)
    if not url or (current is None and (conf.get("redislock_url") or conf.get("redislock_client"))):
        return
    if current is not None:
        if current[0] != url:
            raise ConfigurationError(
                f"{setting}={url!r} and {current[1]}={current[0]!r} name two lock stores, "
                "and an app has one: set redislock_url to the one both shims use"
            )
        return
    _followed[app] = (url, setting)
    app.add_defaults({"redislock_url": url})
    config.reset(app)  # (settings another task built before this one bound)


class AllArguments:
    """A key of every argument of a call (the peers' default): the values bound
    through the signature, in its order, as canonical JSON (``[1,2]``), so
    ``f(1, 2)`` and ``f(a=1, b=2)`` are one job; arguments a ``**kwargs``
    takes follow as ``["name", value]`` pairs, sorted by name."""

    def __init__(self, task_name: str, run: Any, bound: bool) -> None:
        self._spec = KeySpec(task_name, run, None, bound=bound)
        signature = self._spec.signature
        self._names = tuple(signature.parameters) if signature is not None else ()

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        arguments = self._spec.bind(args, kwargs)
        values: list[Any] = [arguments.pop(n) for n in self._names if n in arguments]
        values += [[n, arguments[n]] for n in sorted(arguments)]
        return canonical(values)

    def __repr__(self) -> str:
        return "<every argument>"


class PeerTask(LockedTask):
    """Base of the shims: a unique job per key, with a run lock on the same key."""

    unique = "until_finished"
    #: Seconds a job's key lives from its publish (None: no deadline); set at bind.
    _compat_timeout: Optional[float] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        own = {o: cls.__dict__[o] for o in cls.foreign_options if o in cls.__dict__}
        cls._translate(own)
        super().__init_subclass__(**kwargs)

    @classmethod
    def _translate(cls, own: dict[str, Any]) -> None:
        """Set LockedTask's options from the peer's: ``own``, the class's own
        values of them (inherited ones are read with getattr)."""

    @classmethod
    def _set_key(cls, names: Any) -> None:
        """The job's key: parameter ``names``, [] for one job per task, None
        for every argument.  It is the run lock's key too, unless the task
        names a ``lock_key`` of its own."""
        if names is None:
            if "run" not in cls.__dict__:
                return  # a base class: its tasks get theirs
            name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
            bound = not isinstance(cls.__dict__["run"], staticmethod)
            names = AllArguments(name, cls.run, bound)
        elif isinstance(names, str):
            names = [names]
        else:
            names = list(names) or None
        option = "unique_key" if "lock_key" in cls.__dict__ else "lock_key"
        if option not in cls.__dict__:
            setattr(cls, option, names)

    # -- publishing ---------------------------------------------------------

    def _deadline_headers(self, options: dict[str, Any], seconds: Optional[float]) -> None:
        """Stamp the job's deadline: ``seconds`` after it may start."""
        if seconds is None:
            return
        headers = options["headers"] = dict(options.get("headers") or {})
        if deadline.HEADER in headers:  # a retry: the job's own deadline still
            return
        headers[deadline.HEADER] = time.time() + _delay(options) + float(seconds)

    # -- running ------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        when = None
        if request is not None and not request.called_directly:
            when = header(request, deadline.HEADER)
        if when is None:
            return super().__call__(*args, **kwargs)
        cap = _Cap(self, request)
        clock = deadline.deadlines()
        handle = clock.at(float(when), cap.fire)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            cap.done = True
            clock.cancel(handle)


class _Cap:
    """One run's deadline: its job lets its key go then, if it still holds it."""

    __slots__ = ("done", "request", "task")

    def __init__(self, task: Any, request: Any) -> None:
        self.task = task
        self.request = request
        self.done = False

    def fire(self) -> Optional[float]:
        if self.done:
            return None
        hold = getattr(self.request, "redislock", None)
        if not isinstance(hold, Hold):
            return 0.05  # the run has not taken its lock (and key) yet
        run = hold.unique
        if run is None or run.claim.mode != "f" or self.done:
            return None
        claim = run.claim
        try:
            dropped = unique.drop(config.client_for(self.task.app), claim.key, claim.job)
        except BackendUnavailable as exc:
            logger.warning("could not free unique key %s at its deadline: %s", claim.key, exc)
            return 1.0
        if run.lease is not None:
            run.lease.stop()
        if dropped:
            logger.info(
                "%s[%s]: unique key %s let go at its timeout; the run goes on",
                self.task.name,
                claim.job,
                claim.key,
            )
        return None


def _delay(options: dict[str, Any]) -> float:
    """Seconds until a message may run (its countdown or ETA)."""
    countdown = options.get("countdown")
    if countdown:
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if eta is None:
        return 0.0
    if isinstance(eta, str):
        eta = datetime.fromisoformat(eta)
    now = datetime.now(eta.tzinfo) if eta.tzinfo is not None else datetime.now()
    return max(0.0, float((eta - now).total_seconds()))


def timeout_of(value: Any, where: str) -> Optional[float]:
    """A peer's timeout in seconds (None: none), or ConfigurationError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigurationError(f"{where}={value!r} must be a positive number of seconds")
    return float(value)


def keys_of(value: Any, where: str) -> Optional[Sequence[str]]:
    """A peer's list of key parameter names (None: every argument)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigurationError(f"{where}={value!r} must be a list of parameter names")
