"""The Celery app of the compat tests' workers: the same tasks on the shims
(``celery_redislock.compat``) and, when installed, on the originals
(celery-once, celery-singleton), named ``c.<flavour>.<name>``.

Configured from REDISLOCK_TEST_REDIS (a redis://host:port base URL): broker on
db 1, results on db 2, recordings on db 3, and the peers' store on db 4
(``ONCE['settings']['url']`` and ``singleton_backend_url``; the shims follow
it).  Bodies record ``start`` and ``end`` under ``runs:<tag>`` with their
task id and monotonic times, so tests assert run counts and overlaps.
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any, Optional

import redis
from celery import Celery

from celery_redislock import compat

BASE = os.environ.get("REDISLOCK_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")
STORE = f"{BASE}/4"

app = Celery("compat_tests", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": STORE}},
    singleton_backend_url=STORE,
    # A dead worker's running job frees its key within this lease.
    redislock_lock_ttl=1.5,
    redislock_lock_retry_backoff=0.05,
    redislock_lock_retry_backoff_max=0.3,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    result_expires=600,
    broker_connection_retry_on_startup=True,
)

_rec: Optional[redis.Redis] = None


def recorder() -> redis.Redis:
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(f"{BASE}/3")
    return _rec


def body(task: Any, tag: str, duration: float, **extra: Any) -> str:
    rec = recorder()
    start = time.monotonic()
    rec.rpush(f"started:{tag}", json.dumps({"id": task.request.id, "start": start}))
    time.sleep(duration)
    end = time.monotonic()
    rec.rpush(
        f"runs:{tag}",
        json.dumps(
            {"id": task.request.id, "start": start, "end": end, "retries": task.request.retries}
        ),
    )
    return task.request.id


class Flaky(Exception):
    """Raised once by the autoretry tasks."""


def originals() -> Optional[SimpleNamespace]:
    """celery-once and celery-singleton, when both are installed."""
    try:
        import celery_once
        import celery_singleton
    except ImportError:
        return None
    return SimpleNamespace(
        QueueOnce=celery_once.QueueOnce,
        AlreadyQueued=celery_once.AlreadyQueued,
        Singleton=celery_singleton.Singleton,
        DuplicateTaskError=celery_singleton.DuplicateTaskError,
        clear_locks=celery_singleton.clear_locks,
    )


SHIMS = SimpleNamespace(
    QueueOnce=compat.QueueOnce,
    AlreadyQueued=compat.AlreadyQueued,
    Singleton=compat.Singleton,
    DuplicateTaskError=compat.DuplicateTaskError,
    clear_locks=compat.clear_locks,
)


def define(flavour: str, peer: SimpleNamespace) -> SimpleNamespace:
    """The worker tests' tasks on ``peer``'s base classes."""
    tasks = SimpleNamespace()

    def task(name: str, **options: Any) -> Any:
        return app.task(name=f"c.{flavour}.{name}", **options)

    @task("once_sleep", base=peer.QueueOnce, bind=True, once={"keys": ["job"], "timeout": 1})
    def once_sleep(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        return body(self, tag, duration)

    @task("once_plain", base=peer.QueueOnce, bind=True, once={"keys": ["job"]})
    def once_plain(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        return body(self, tag, duration)

    @task(
        "once_ubr",
        base=peer.QueueOnce,
        bind=True,
        once={"keys": ["job"], "unlock_before_run": True},
    )
    def once_ubr(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        return body(self, tag, duration)

    @task("once_hard", base=peer.QueueOnce, bind=True, once={"keys": ["job"]}, time_limit=1)
    def once_hard(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        return body(self, tag, duration)

    @task("once_fail", base=peer.QueueOnce, bind=True, once={"keys": ["job"]})
    def once_fail(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        body(self, tag, duration)
        raise Flaky(job)

    @task("single", base=peer.Singleton, bind=True, unique_on=["job"])
    def single(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        return body(self, tag, duration)

    @task(
        "single_started", base=peer.Singleton, bind=True, unique_on=["job"], unique="until_started"
    )
    def single_started(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        return body(self, tag, duration)

    @task("single_expiry", base=peer.Singleton, bind=True, unique_on=["job"], lock_expiry=1)
    def single_expiry(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        return body(self, tag, duration)

    @task("single_fail", base=peer.Singleton, bind=True, unique_on=["job"])
    def single_fail(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        body(self, tag, duration)
        raise Flaky(job)

    @task("single_retry", base=peer.Singleton, bind=True, unique_on=["job"])
    def single_retry(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        out = body(self, tag, duration)
        if self.request.retries < 1:
            raise self.retry(countdown=0.2, max_retries=3)
        return out

    @task(
        "single_autoretry",
        base=peer.Singleton,
        bind=True,
        unique_on=["job"],
        raise_on_duplicate=True,
        autoretry_for=(Flaky,),
        max_retries=2,
        default_retry_delay=0.2,
    )
    def single_autoretry(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        out = body(self, tag, duration)
        if self.request.retries < 1:
            raise Flaky(job)
        return out

    @task("single_hard", base=peer.Singleton, bind=True, unique_on=["job"], time_limit=1)
    def single_hard(self: Any, job: str, tag: str, duration: float = 0.0) -> str:
        return body(self, tag, duration)

    for name, value in list(locals().items()):
        if hasattr(value, "delay"):
            setattr(tasks, name, value)
    return tasks


shim = define("shim", SHIMS)
_peers = originals()
orig = define("orig", _peers) if _peers is not None else None
