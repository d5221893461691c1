"""The Celery app of bench/semaphores.py, loaded by the benchmark and by its workers.

Configured from BENCH_REDIS (a redis://host:port base URL, no db): locks on
db 0, broker on db 1, results on db 2, recordings on db 3 (the layout of
bench_app.py).  Library defaults, except the contention-retry backoff, set
to the test suite's 0.05 s doubling to 0.4 s as bench_app.py does (the
default, 1 s doubling to 30 s, is tuned for production, not for a 4 s drain).

Every body sleeps ``duration`` and records (id, seq, start, end, pid, fence)
on db 3; every publish, from any process, is counted per task name on db 3 by
a ``before_task_publish`` receiver, so the benchmark can tell re-publishes
(retry, park) from the messages it sent itself.  Receivers also stamp, per
task id (hash ``t:<id>``, CLOCK_MONOTONIC seconds), the last time its message
was published, received by a worker's main process, started in a pool child
(``task_prerun``), and when its run took and gave back its lock, so the
benchmark can break a handoff down into its steps.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import redis
from celery import Celery, current_task, signals

from celery_redislock import LockedTask
from celery_redislock import signals as lock_signals

BASE = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
RECORD_URL = f"{BASE}/3"
#: db 3 hash: task name -> messages published for it, counted by every process.
PUBLISHED = "published"

app = Celery("redislock_bench_limits", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redislock_url=f"{BASE}/0",
    redislock_lock_retry_backoff=0.05,
    redislock_lock_retry_backoff_max=0.4,
    # One message per child at a time: what a long-task worker runs with, and
    # what lets a second worker take its share of a burst.
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    result_expires=600,
    broker_connection_retry_on_startup=True,
)

_rec: Optional[redis.Redis] = None


def recorder() -> redis.Redis:
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(RECORD_URL)
    return _rec


def body(tag: str, seq: int, duration: float) -> int:
    start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on the machine
    time.sleep(duration)
    end = time.monotonic()
    request = current_task.request
    record = {
        "id": request.id,
        "seq": seq,
        "start": start,
        "end": end,
        "pid": os.getpid(),
        "fence": getattr(request, "lock_fence", None),
    }
    recorder().rpush(f"runs:{tag}", json.dumps(record))
    return seq


# Not bind=True: the bodies find their request through current_task.


@app.task(name="bench.sem3_wait", base=LockedTask, semaphore=3, on_contention="wait")
def sem3_wait(tag: str, seq: int, duration: float) -> int:
    return body(tag, seq, duration)


@app.task(name="bench.sem3_park", base=LockedTask, semaphore=3, on_contention="park")
def sem3_park(tag: str, seq: int, duration: float) -> int:
    return body(tag, seq, duration)


def _job(policy: str) -> Any:
    @app.task(name=f"bench.job_{policy}", base=LockedTask, lock_key=["job"], on_contention=policy)
    def job(job: str, tag: str, seq: int, duration: float) -> int:
        return body(tag, seq, duration)

    return job


job_park = _job("park")
job_retry = _job("retry")
job_wait = _job("wait")


def stamp(task_id: Optional[str], step: str) -> None:
    if task_id:
        recorder().hset(f"t:{task_id}", step, repr(time.monotonic()))


def _on_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
    stamp((headers or {}).get("id"), "published")
    recorder().hincrby(PUBLISHED, str(sender), 1)


def _on_received(request: Any = None, **_: Any) -> None:
    stamp(getattr(request, "id", None), "received")


def _on_prerun(task_id: Optional[str] = None, **_: Any) -> None:
    stamp(task_id, "prerun")


def _on_acquired(request: Any = None, **_: Any) -> None:
    stamp(getattr(request, "id", None), "acquired")


def _on_released(request: Any = None, **_: Any) -> None:
    stamp(getattr(request, "id", None), "released")


signals.before_task_publish.connect(_on_publish, weak=False, dispatch_uid="bench-published")
signals.task_received.connect(_on_received, weak=False, dispatch_uid="bench-received")
signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="bench-prerun")
lock_signals.lock_acquired.connect(_on_acquired, weak=False, dispatch_uid="bench-acquired")
lock_signals.lock_released.connect(_on_released, weak=False, dispatch_uid="bench-released")
