"""Prometheus metrics of locked task runs, built on the library's own signals.

Switched on in a worker by ``redislock_metrics_port`` (the ``celery``
command's worker-start hook then adds :class:`MetricsStep`, which serves
``/metrics`` on that port), or in any process by :func:`install` (and
:func:`serve`, or the process's own exporter of prometheus_client's default
registry).  Needs the ``prometheus`` extra (``prometheus_client``).

Every figure is counted by a receiver of :mod:`celery_redislock.signals`:
no second code path, and while metrics are off nothing listens, so the
runs compute nothing for them.  Labels are the task's name and the kind of
primitive (``lock``, ``semaphore``, ``rwlock``), never a lock's key, whose
values are unbounded.

Prefork: the pool's processes record, the main process serves.  They meet
in prometheus_client's multiprocess mode: ``PROMETHEUS_MULTIPROC_DIR`` names
an empty directory, one per worker, set before the worker starts (a worker
with the prefork pool refuses to start without it); a pool process marks
itself dead as it exits (``worker_process_shutdown``).

The endpoint (which registry, the HTTP server) is
:mod:`celery_redislock.ops.metrics_endpoint`.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Optional

from celery import bootsteps
from celery.signals import worker_process_shutdown

from .. import _spelling, config, signals
from ..exceptions import ConfigurationError
from ..primitives import Kind as PrimitiveKind
from ..tasks.targets import kind_of
from .entries import Kind
from .metrics_endpoint import (
    MULTIPROC_ENV,
    Server,
    client,
    endpoint_registry,
    multiproc_dir,
    multiprocess,
    serve,
)

__all__ = [
    "BUCKETS",
    "MULTIPROC_ENV",
    "Metrics",
    "MetricsStep",
    "Server",
    "endpoint_registry",
    "install",
    "serve",
    "wanted",
]

logger = logging.getLogger("celery_redislock")

#: The setting that switches a worker's endpoint on.
SETTING = "redislock_metrics_port"
#: Histogram buckets (seconds): a hand-over takes milliseconds, a task's hold minutes.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)

#: Labels of the lock metrics; the duplicates counter has ("task", "action").
LABELS = ("task", "kind")
#: signal, receiver method.
_RECEIVERS = (
    ("lock_acquired", "on_acquired"),
    ("lock_contended", "on_contended"),
    ("task_skipped", "on_skipped"),
    ("task_republished", "on_republished"),
    ("lock_released", "on_released"),
    ("lock_lost", "on_lost"),
    ("task_duplicate", "on_duplicate"),
    ("rate_limited", "on_rate_limited"),
)


class Metrics:
    """The library's metrics in one registry (default: prometheus_client's),
    and the signal receivers that count them."""

    def __init__(self, registry: Any = None) -> None:
        pc = client()
        reg = pc.REGISTRY if registry is None else registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = LABELS) -> Any:
            return pc.Counter(f"celery_redislock_{name}", doc, labels, registry=reg)

        def histogram(name: str, doc: str) -> Any:
            return pc.Histogram(
                f"celery_redislock_{name}", doc, LABELS, registry=reg, buckets=BUCKETS
            )

        # Counters are exposed with a _total suffix.
        self.acquired = counter("acquired", "Task runs that took their lock.")
        self.contended = counter(
            "contended",
            "Task runs that found their lock held, by the contention policy applied.",
            (*LABELS, "policy"),
        )
        self.skipped = counter(
            "skipped", "Task runs dropped by skip (on_contention or on_rate_limited)."
        )
        self.parked = counter("parked", "Task runs parked in Redis behind a holder.")
        self.republished = counter(
            "republished", "Parked runs re-published once granted their lock."
        )
        self.lost = counter("lost", "Leases found gone while held.")
        self.duplicates = counter(
            "duplicates",
            "Publishes of a unique job that met a job holding its key, by what was done.",
            ("task", "action"),
        )
        self.rate_limited = counter(
            "rate_limited",
            "Task runs that found no start free under their rate limit, by on_rate_limited.",
            ("task", "policy"),
        )
        self.wait = histogram(
            "wait_seconds", "Seconds a run waited for its lock (a parked run: since its publish)."
        )
        self.hold = histogram("hold_seconds", "Seconds a run held its lock, grant to release.")
        #: task name -> (name, kind) labels; a task's kind never changes.
        self._labels: dict[str, tuple[str, str]] = {}
        #: lease -> the grant last counted lost: renewal and then the release
        #: may both report one lost lease.
        self._lost: weakref.WeakKeyDictionary[Any, Optional[float]] = weakref.WeakKeyDictionary()
        self._lost_lock = threading.Lock()

    def connect(self) -> None:
        """Connect the receivers (idempotent: one set per process)."""
        for signal, method in _RECEIVERS:
            getattr(signals, signal).connect(
                getattr(self, method), weak=False, dispatch_uid=f"celery_redislock.metrics.{signal}"
            )
        signals.connect()  # the renewal keeper's lost leases reach lock_lost

    def disconnect(self) -> None:
        for signal, _ in _RECEIVERS:
            getattr(signals, signal).disconnect(dispatch_uid=f"celery_redislock.metrics.{signal}")

    def labels_of(self, task: Any) -> tuple[str, str]:
        """(task name, kind) of a signal's sender (a task, a task name or None)."""
        if task is None or isinstance(task, str):
            return task or "", ""
        name = getattr(task, "name", None) or ""
        found = self._labels.get(name)
        if found is None:
            found = self._labels[name] = (name, kind_of(task).value)
        return found

    # -- receivers (sender = the task, see celery_redislock.signals) ----------------

    def on_acquired(self, sender: Any = None, waited: Optional[float] = None, **_: Any) -> None:
        labels = self.labels_of(sender)
        self.acquired.labels(*labels).inc()
        if waited is not None:
            self.wait.labels(*labels).observe(waited)

    def on_contended(self, sender: Any = None, policy: str = "", **_: Any) -> None:
        labels = self.labels_of(sender)
        self.contended.labels(*labels, policy).inc()
        if policy == "park":
            self.parked.labels(*labels).inc()

    def on_skipped(self, sender: Any = None, **_: Any) -> None:
        self.skipped.labels(*self.labels_of(sender)).inc()

    def on_republished(self, sender: Any = None, task_name: str = "", **_: Any) -> None:
        labels = self.labels_of(sender if sender is not None else task_name)
        self.republished.labels(*labels).inc()

    def on_released(self, sender: Any = None, held: Optional[float] = None, **_: Any) -> None:
        if held is not None:
            self.hold.labels(*self.labels_of(sender)).observe(held)

    def on_lost(self, sender: Any = None, lock: Any = None, **_: Any) -> None:
        if lock is not None:
            grant = getattr(lock, "granted_at", None)
            with self._lost_lock:
                if lock in self._lost and self._lost[lock] == grant:
                    return  # this lease was counted when renewal found it gone
                self._lost[lock] = grant
        name, kind = self.labels_of(sender)
        if not kind:  # a bare primitive: its own kind
            kind = _kind_of_primitive(lock)
        self.lost.labels(name, kind).inc()

    def on_rate_limited(self, sender: Any = None, policy: str = "", **_: Any) -> None:
        self.rate_limited.labels(getattr(sender, "name", "") or "", policy).inc()

    def on_duplicate(self, sender: Any = None, action: str = "", **_: Any) -> None:
        name = sender if isinstance(sender, str) else getattr(sender, "name", "")
        self.duplicates.labels(name or "", action).inc()


def _kind_of_primitive(lock: Any) -> str:
    kind = getattr(lock, "kind", None)
    return kind.value if isinstance(kind, PrimitiveKind) else str(Kind.LOCK)


_metrics: Optional[Metrics] = None
_install_lock = threading.Lock()


def install(app: Any = None) -> Metrics:
    """Count the library's signals in this process and the processes it forks
    later (idempotent), in prometheus_client's default registry.

    With ``app``, a worker of that app also serves them on
    ``redislock_metrics_port`` (for a worker started without the ``celery``
    command, whose worker-start hook does this).
    """
    global _metrics
    with _install_lock:
        if _metrics is None:
            metrics = Metrics()
            metrics.connect()
            worker_process_shutdown.connect(
                _on_process_shutdown, weak=False, dispatch_uid="celery_redislock.metrics"
            )
            _metrics = metrics
    if app is not None:
        app.steps["worker"].add(MetricsStep)
    return _metrics


def _on_process_shutdown(pid: Optional[int] = None, **_: Any) -> None:
    path = os.environ.get(MULTIPROC_ENV)
    if path and pid:
        multiprocess().mark_process_dead(pid, path)


def wanted(app: Any) -> bool:
    """Whether ``app`` sets ``redislock_metrics_port`` (to a bad value too:
    :class:`MetricsStep` reports it), as the worker-start hook asks."""
    conf = app.conf
    return any(
        name == SETTING and conf.get(written) not in (None, 0)
        for written, name in _spelling.keys_like(conf, SETTING)
    )


def _is_prefork(pool_cls: Any) -> bool:
    from celery.concurrency.prefork import TaskPool

    return isinstance(pool_cls, type) and issubclass(pool_cls, TaskPool)


class MetricsStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Serves the worker's metrics on ``redislock_metrics_port``.

    Checked as the worker is built (a bad setting, a missing prometheus_client
    or multiprocess directory stops it); the receivers are connected then, so
    the pool's processes inherit them; the endpoint opens once the pool runs.
    """

    name = "celery_redislock.metrics"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        app = worker.app
        config.reset(app)  # read app.conf as it is now, after every override
        settings = config.settings_for(app)
        self.port = settings.metrics_port
        self.addr = settings.metrics_addr
        self.server: Optional[Server] = None
        if self.port:
            where = f"{_spelling.spelled(app.conf, SETTING)}={self.port!r}"
            client(where)
            prefork = _is_prefork(worker.pool_cls)
            if multiproc_dir() is None and prefork:
                raise ConfigurationError(
                    f"{where} with the prefork pool needs {MULTIPROC_ENV}: set it to an "
                    "empty directory of this worker's own before the worker starts "
                    "(prometheus_client's multiprocess mode; the pool's processes record)"
                )
            install()
        super().__init__(worker, **kwargs)

    def include_if(self, worker: Any) -> bool:
        return bool(self.port)

    def start(self, worker: Any) -> None:
        if not self.port:
            return
        self.server = serve(self.port, self.addr)
        logger.info(
            "celery_redislock: metrics on http://%s:%d/metrics%s",
            self.addr,
            self.server.port,
            f" ({MULTIPROC_ENV}={os.environ[MULTIPROC_ENV]})" if multiproc_dir() else "",
        )

    def stop(self, worker: Any) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()

    terminate = stop
