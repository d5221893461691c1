"""The Celery app of bench/rates.py's worker part, loaded by the benchmark and by its workers.

Configured from BENCH_REDIS (a redis://host:port base URL, no db): locks and
rate limits on db 0, broker on db 1, results on db 2, recordings on db 3.
Celery's defaults otherwise (prefetch multiplier 4, results ignored).

Every body records its start (``time.time()``: the processes of one machine
share the clock) on db 3, list ``starts:<tag>``.  Every message is counted
per task id twice on db 3: as it is published, by a ``before_task_publish``
receiver in whichever process sends it (hash ``published:<task name>``),
and as a worker's main process receives it, by a ``task_received``
receiver (hash ``received:<task name>``).  A deferred or retried run keeps
its task id, so the largest count is the most messages any one run took.
A LockedTask run that could not start at once records the moment of the
slot it took (hash ``slots:<task name>``, from the ``rate_limited`` signal).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import redis
from celery import Celery, signals
from celery_heimdall import HeimdallTask, RateLimit

from celery_redislock import LockedTask
from celery_redislock import signals as lock_signals

BASE = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
LOCK_URL = f"{BASE}/0"
RECORD_URL = f"{BASE}/3"
#: The limit of every task here, as each library spells it.
RATE = "20/s"
PER_SECOND = 20

app = Celery("redislock_bench_rates", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redislock_url=LOCK_URL,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

_rec: Optional[redis.Redis] = None


def recorder() -> redis.Redis:
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(RECORD_URL)
    return _rec


def started(task_id: Optional[str], tag: str, seq: int) -> None:
    start = time.time()
    recorder().rpush(f"starts:{tag}", json.dumps({"id": task_id, "seq": seq, "t": start}))


@app.task(name="rates.defer", base=LockedTask, bind=True, global_rate_limit=RATE)
def deferred(self: Any, tag: str, seq: int) -> None:
    """``on_rate_limited="defer"`` (the default): re-sent once, to its slot."""
    started(self.request.id, tag, seq)


@app.task(
    name="rates.wait",
    base=LockedTask,
    bind=True,
    global_rate_limit=RATE,
    on_rate_limited="wait",
    lock_wait_timeout=30,
)
def waiting(self: Any, tag: str, seq: int) -> None:
    """``on_rate_limited="wait"``: sleeps in the pool process until its slot."""
    started(self.request.id, tag, seq)


@app.task(name="rates.celery", bind=True, rate_limit=RATE)
def celery_rate(self: Any, tag: str, seq: int) -> None:
    """Celery's own ``rate_limit``: a token bucket in each worker."""
    started(self.request.id, tag, seq)


class BenchHeimdall(HeimdallTask):  # type: ignore[misc]
    """HeimdallTask on the lock db (its documented way: override setup_redis)."""

    abstract = True

    def setup_redis(self) -> redis.Redis:
        return redis.Redis.from_url(LOCK_URL)


@app.task(
    name="rates.heimdall",
    base=BenchHeimdall,
    bind=True,
    # One key for every run: heimdall's rate-limit key is a hash of the
    # arguments otherwise, a limit per distinct call.
    heimdall={"rate_limit": RateLimit((PER_SECOND, 1)), "key": "bench"},
)
def heimdall_rate(self: Any, tag: str, seq: int) -> None:
    """celery-heimdall's global rate limit (its README's form): a run over it
    retries with the countdown it computes."""
    started(self.request.id, tag, seq)


def _published(sender: Any = None, headers: Any = None, **_: Any) -> None:
    task_id = (headers or {}).get("id")
    if task_id:
        recorder().hincrby(f"published:{sender}", task_id, 1)


def _received(request: Any = None, **_: Any) -> None:
    if request is not None:
        recorder().hincrby(f"received:{request.name}", request.id, 1)


def _rate_limited(sender: Any = None, request: Any = None, delay: float = 0.0, **_: Any) -> None:
    """The moment of the slot a LockedTask run took (now, read just after the
    script's reply, plus the delay), for a run that could not start at once."""
    if sender is not None and request is not None:
        recorder().hset(f"slots:{sender.name}", request.id, repr(time.time() + delay))


signals.before_task_publish.connect(_published, weak=False, dispatch_uid="bench-rates-published")
signals.task_received.connect(_received, weak=False, dispatch_uid="bench-rates-received")
lock_signals.rate_limited.connect(_rate_limited, weak=False, dispatch_uid="bench-rates-slots")
