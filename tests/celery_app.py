"""The Celery app that worker subprocesses in the integration tests load.

Configured from REDISLOCK_TEST_REDIS (a redis://host:port base URL): broker on
db 1, results on db 2, locks on db 0, and what the task bodies record on db 3.
Bodies record (start, end, fence, pid) so tests can assert measured facts:
overlap, run counts, order.
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery

from celery_redislock import LockedTask

BASE = os.environ.get("REDISLOCK_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")

app = Celery("redislock_tests", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redislock_url=f"{BASE}/0",
    redislock_lock_retry_backoff=0.05,
    redislock_lock_retry_backoff_max=0.4,
    redislock_lock_ttl=5.0,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_track_started=False,
    result_expires=600,
    broker_connection_retry_on_startup=True,
)

_rec: redis.Redis | None = None


def recorder() -> redis.Redis:
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(f"{BASE}/3")
    return _rec


def record(tag: str, **fields: object) -> None:
    recorder().rpush(f"runs:{tag}", json.dumps(fields))


def body(task, tag: str, duration: float, **extra: object) -> dict:
    start = time.monotonic()
    time.sleep(duration)
    end = time.monotonic()
    fence = getattr(task.request, "lock_fence", None)
    record(tag, id=task.request.id, start=start, end=end, fence=fence, pid=os.getpid(), **extra)
    return {"fence": fence}


def _make(policy: str):
    @app.task(name=f"t.job_{policy}", base=LockedTask, bind=True, on_contention=policy,
              lock_key=["job"], lock_wait_timeout=30)
    def job(self, job: str, tag: str, duration: float = 0.3, seq: int = 0):
        return body(self, tag, duration, job=job, seq=seq)

    return job


job_skip = _make("skip")
job_retry = _make("retry")
job_wait = _make("wait")
job_fail = _make("fail")
