"""The Celery app of the metrics worker tests (tests/integration/test_metrics.py).

Same layout as celery_app.py (REDISLOCK_TEST_REDIS base URL; broker db 1,
results db 2, locks db 0, recordings db 3), with a queue and a key prefix of
its own.  A worker serves metrics on REDISLOCK_TEST_METRICS_PORT when set
(taken as it is written when it is not a number, for the bad-value test).
Bodies record their start in ``started:<tag>``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional

import redis
from celery import Celery, current_task

from celery_redislock import LockedTask, config

BASE = os.environ.get("REDISLOCK_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")

app = Celery("redislock_metrics", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redislock_url=f"{BASE}/0",
    redislock_key_prefix="metrics-test",
    redislock_lock_ttl=5.0,
    task_default_queue="redislock-metrics",
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    result_expires=600,
    broker_connection_retry_on_startup=True,
)
_port = os.environ.get("REDISLOCK_TEST_METRICS_PORT")
if _port:
    app.conf.redislock_metrics_port = int(_port) if _port.isdigit() else _port
    app.conf.redislock_metrics_addr = "127.0.0.1"


_rec: Optional[redis.Redis] = None


def recorder() -> redis.Redis:
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(f"{BASE}/3")
    return _rec


def configure(base: str) -> None:
    """Point the app at another Redis (the test process imports this module once)."""
    global BASE, _rec
    BASE = base.rstrip("/")
    app.conf.update(broker_url=f"{BASE}/1", result_backend=f"{BASE}/2", redislock_url=f"{BASE}/0")
    _rec = None
    config.reset(app)


def _run(tag: str, duration: float) -> str:
    recorder().rpush(
        f"started:{tag}", json.dumps({"id": current_task.request.id, "pid": os.getpid()})
    )
    time.sleep(duration)
    return current_task.request.id


def _task(name: str, **options: object):
    @app.task(name=name, base=LockedTask, lock_key=["job"], **options)
    def run(job: str, tag: str, duration: float = 0.0) -> str:
        return _run(tag, duration)

    return run


lock = _task("m.lock", on_contention="skip")
park = _task("m.park", on_contention="park")
sem = _task("m.sem", semaphore=2, on_contention="skip")
read = _task("m.read", lock_mode="read", lock_name="m.rw", on_contention="skip")
write = _task("m.write", lock_mode="write", lock_name="m.rw", on_contention="skip")
unique = _task("m.unique", unique="until_finished")


@app.task(name="m.publish_twice")
def publish_twice(job: str, tag: str) -> list[str]:
    """Publishes a unique job twice from the worker: the second is a duplicate."""
    return [unique.delay(job, tag, 0.3).id for _ in range(2)]


@app.task(name="m.rate", base=LockedTask, global_rate_limit="1/m", on_rate_limited="fail")
def rate(tag: str) -> str:
    """One start a minute: a second run within it fails with RateLimited."""
    return tag


@app.task(name="m.lose", base=LockedTask, lock_key=["job"], lock_ttl=1.0)
def lose(job: str, tag: str) -> str:
    """Deletes its own lock: renewal (every third of the lease) finds it gone,
    and so does the release."""
    config.client_for(app).delete(current_task.request.redislock.key)
    return _run(tag, 1.0)
