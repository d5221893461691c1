"""Celery app for the semaphore / read-write / park integration tests.

Same layout as celery_app.py (REDISLOCK_TEST_REDIS base URL; broker db 1,
results db 2, locks db 0, recordings db 3).
"""

from __future__ import annotations

import json
import os
import time

from celery import Celery
from celery.signals import after_task_publish

from celery_redislock import LockedTask
from tests.celery_app import body, record, recorder

BASE = os.environ.get("REDISLOCK_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")

app = Celery("redislock_limits", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redislock_url=f"{BASE}/0",
    redislock_lock_ttl=5.0,
    redislock_semaphores={"payments-api": 3},
    redislock_park_reserve=float(os.environ.get("REDISLOCK_TEST_PARK_RESERVE", "2.0")),
    # A huge value keeps a worker's own sweeper idle (test_park.py's crash test
    # has recovery done by another worker).
    redislock_park_sweep_interval=float(os.environ.get("REDISLOCK_TEST_PARK_SWEEP", "0.5")),
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    result_expires=600,
    broker_connection_retry_on_startup=True,
)
if os.environ.get("REDISLOCK_TEST_LOCK_URL"):
    # A worker whose lock store is a server of its own (test_park_durability.py).
    app.conf.redislock_url = os.environ["REDISLOCK_TEST_LOCK_URL"]
if os.environ.get("REDISLOCK_TEST_CONF"):
    app.conf.update(json.loads(os.environ["REDISLOCK_TEST_CONF"]))


@app.task(name="l.sem3", base=LockedTask, bind=True, semaphore=3, on_contention="wait")
def sem3(self, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, seq=seq)


@app.task(name="l.sem3_park", base=LockedTask, bind=True, semaphore=3, on_contention="park")
def sem3_park(self, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, seq=seq)


@app.task(
    name="l.per_customer",
    base=LockedTask,
    bind=True,
    semaphore=2,
    lock_key=["customer"],
    on_contention="wait",
)
def per_customer(self, customer: str, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, customer=customer, seq=seq)


@app.task(
    name="l.pay_a",
    base=LockedTask,
    bind=True,
    concurrency_group="payments-api",
    on_contention="wait",
)
def pay_a(self, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, kind="a", seq=seq)


@app.task(
    name="l.pay_b",
    base=LockedTask,
    bind=True,
    concurrency_group="payments-api",
    on_contention="park",
)
def pay_b(self, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, kind="b", seq=seq)


@app.task(
    name="l.read",
    base=LockedTask,
    bind=True,
    lock_mode="read",
    lock_name="dataset",
    on_contention="wait",
)
def read(self, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, mode="r", seq=seq)


@app.task(
    name="l.write",
    base=LockedTask,
    bind=True,
    lock_mode="write",
    lock_name="dataset",
    on_contention="wait",
)
def write(self, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, mode="w", seq=seq)


@after_task_publish.connect
def _published(sender=None, headers=None, **_: object) -> None:
    """When each l.park message was published (by whichever process sent it):
    test_park.py times the library's re-publishing with it, apart from how
    soon a worker whose pool processes were killed fetches and runs it."""
    if sender == "l.park" and headers:
        recorder().rpush(f"published:{headers['id']}", time.monotonic())


@app.task(name="l.park", base=LockedTask, bind=True, lock_key=["job"], on_contention="park")
def parked_job(self, job: str, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, job=job, seq=seq)


@app.task(
    name="l.retry",
    base=LockedTask,
    bind=True,
    lock_key=["job"],
    on_contention="retry",
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.4,
)
def retry_job(self, job: str, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, job=job, seq=seq)


@app.task(name="l.wait", base=LockedTask, bind=True, lock_key=["job"], on_contention="wait")
def wait_job(self, job: str, tag: str, duration: float = 0.2, seq: int = 0):
    return body(self, tag, duration, job=job, seq=seq)


# ---------------------------------------------------------------------------
# Tasks of tests/integration/test_limits_tasks.py and test_park.py.


def _sem2(policy: str):
    @app.task(
        name=f"l.sem2_{policy}",
        base=LockedTask,
        bind=True,
        semaphore=2,
        on_contention=policy,
        lock_retry_backoff=0.05,
        lock_retry_backoff_max=0.2,
    )
    def sem2(self, tag: str, duration: float = 0.2, seq: int = 0):
        return body(self, tag, duration, seq=seq)

    return sem2


sem2_skip = _sem2("skip")
sem2_fail = _sem2("fail")
sem2_retry = _sem2("retry")


@app.task(
    name="l.per_customer_plain",
    base=LockedTask,
    semaphore=2,
    lock_key=["customer"],
    on_contention="wait",
)
def per_customer_plain(customer: str, tag: str, duration: float = 0.2, seq: int = 0):
    """l.per_customer without bind=True."""
    from celery import current_task

    return body(current_task, tag, duration, customer=customer, seq=seq)


@app.task(
    name="l.sem1_hang",
    base=LockedTask,
    bind=True,
    semaphore=1,
    lock_name="l.sem1",
    lock_ttl=10.0,
    on_contention="wait",
)
def sem1_hang(self, tag: str, duration: float = 30.0, seq: int = 0):
    """Records its start and pid, then sleeps (until the test kills it)."""
    started = {"start": time.monotonic(), "seq": seq, "pid": os.getpid()}
    recorder().rpush(f"started:{tag}", json.dumps(started))
    return body(self, tag, duration, seq=seq)


@app.task(
    name="l.sem1",
    base=LockedTask,
    bind=True,
    semaphore=1,
    lock_name="l.sem1",
    lock_ttl=3.0,
    on_contention="wait",
)
def sem1(self, tag: str, duration: float = 0.1, seq: int = 0):
    return body(self, tag, duration, seq=seq)


@app.task(name="l.park_probe", base=LockedTask, bind=True, lock_key=["job"], on_contention="park")
def park_probe(self, job: str, tag: str, duration: float = 0.1, **extra: object):
    """A parked task that records what its request looked like when it ran."""
    req = self.request
    out = body(
        self,
        tag,
        duration,
        job=job,
        args=list(req.args or ()),
        kwargs=dict(req.kwargs or {}),
        x_trace=getattr(req, "x_trace", None),
        callbacks=[dict(c) for c in req.callbacks or ()],
        errbacks=[dict(c) for c in req.errbacks or ()],
        routing_key=(req.delivery_info or {}).get("routing_key"),
    )
    return {**out, "job": job, "extra": extra}


def _keyed_job(name: str, **options: object):
    """A task like l.park (one lock per ``job``), with options of its own (test_park_state.py)."""

    @app.task(name=name, base=LockedTask, bind=True, lock_key=["job"], **options)
    def job(self, job: str, tag: str, duration: float = 0.1):
        return body(self, tag, duration, job=job)

    return job


#: Tracks STARTED: the tracer stores it before the run parks.
park_tracked = _keyed_job("l.park_tracked", on_contention="park", track_started=True)
park_quiet = _keyed_job("l.park_quiet", on_contention="park", ignore_result=True)
skip_job = _keyed_job("l.skip", on_contention="skip")


@app.task(name="l.rec")
def rec(value: object = None, *, tag: str, label: str = "") -> None:
    """A plain task for callbacks: records what it was called with, and when."""
    record(tag, label=label, value=value, at=time.monotonic())
