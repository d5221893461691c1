"""Celery app for the rate-limit integration tests (tests/integration/test_rate_tasks.py).

Same layout as celery_app.py (REDISLOCK_TEST_REDIS base URL; broker db 1,
results db 2, locks db 0, recordings db 3).  Every delivery of a task
message is recorded as it reaches a pool process (``task_prerun``), so the
tests count how often each run was sent; the bodies record their start.
"""

from __future__ import annotations

import json
import os
import time

from celery import Celery
from celery.signals import task_prerun

from celery_redislock import LockedTask
from tests.celery_app import record, recorder

BASE = os.environ.get("REDISLOCK_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")

app = Celery("redislock_rates", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redislock_url=f"{BASE}/0",
    redislock_lock_ttl=5.0,
    redislock_lock_retry_backoff=0.05,
    redislock_lock_retry_backoff_max=0.2,
    redislock_rate_limits={"shared": "4/s"},
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    result_expires=600,
    broker_connection_retry_on_startup=True,
)
if os.environ.get("REDISLOCK_TEST_CONF"):
    app.conf.update(json.loads(os.environ["REDISLOCK_TEST_CONF"]))


@task_prerun.connect
def _delivered(sender=None, task_id=None, task=None, **_: object) -> None:
    headers = getattr(task.request, "headers", None) or {}
    tag = (task.request.args or [None])[0]
    if isinstance(tag, str):
        recorder().rpush(
            f"deliveries:{tag}",
            json.dumps(
                {
                    "id": task_id,
                    "hop": headers.get("redislock_rate_slot"),
                    "worker": task.request.hostname,
                }
            ),
        )


def started(task, tag: str, duration: float = 0.0, **extra: object) -> float:
    """Record this run's start (wall clock: the machine's processes share it)."""
    start = time.time()
    record(tag, id=task.request.id, start=start, pid=os.getpid(), **extra)
    if duration:
        time.sleep(duration)
    return start


@app.task(name="r.five", base=LockedTask, bind=True, global_rate_limit="5/s")
def five(self, tag: str, seq: int = 0, duration: float = 0.0):
    return started(self, tag, duration, seq=seq)


@app.task(name="r.one", base=LockedTask, bind=True, global_rate_limit="1/s")
def one(self, tag: str, seq: int = 0):
    return started(self, tag, seq=seq)


@app.task(name="r.group_a", base=LockedTask, bind=True, rate_limit_group="shared")
def group_a(self, tag: str, seq: int = 0):
    return started(self, tag, seq=seq, which="a")


@app.task(name="r.group_b", base=LockedTask, bind=True, rate_limit_group="shared")
def group_b(self, tag: str, seq: int = 0):
    return started(self, tag, seq=seq, which="b")


@app.task(
    name="r.per_user", base=LockedTask, bind=True, global_rate_limit="2/s", rate_limit_key=["user"]
)
def per_user(self, tag: str, user: str, seq: int = 0):
    return started(self, tag, seq=seq, user=user)


@app.task(
    name="r.skip", base=LockedTask, bind=True, global_rate_limit="1/m", on_rate_limited="skip"
)
def skipping(self, tag: str, seq: int = 0):
    return started(self, tag, seq=seq)


@app.task(
    name="r.fail", base=LockedTask, bind=True, global_rate_limit="1/m", on_rate_limited="fail"
)
def failing(self, tag: str, seq: int = 0):
    return started(self, tag, seq=seq)


@app.task(
    name="r.wait", base=LockedTask, bind=True, global_rate_limit="10/s", on_rate_limited="wait"
)
def waiting(self, tag: str, seq: int = 0):
    return started(self, tag, seq=seq)


@app.task(
    name="r.locked",
    base=LockedTask,
    bind=True,
    global_rate_limit="5/s",
    lock_key=["job"],
    on_contention="retry",
)
def locked(self, tag: str, job: str, seq: int = 0, duration: float = 0.3):
    start = time.time()
    record(tag, id=self.request.id, start=start, end=None, seq=seq, fence=self.request.lock_fence)
    time.sleep(duration)
    record(f"{tag}:end", id=self.request.id, start=start, end=time.time(), seq=seq)
    return start
