"""The Celery app of bench/tasks.py, loaded by the benchmark and by its workers.

Configured from BENCH_REDIS (a redis://host:port base URL, no db): locks of
every library on db 0, broker on db 1, results on db 2, and what the task
bodies record on db 3.  Every library under test gets the same worker and the
same lock store; only the task's base class differs.

Two families of tasks: ``*_noop(i)`` for overhead (distinct ``i``, no
contention) and ``*_dup(job, tag)`` for duplicates (a 0.3 s body that records
its start and end, so the benchmark can count runs and measure overlap).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import redis
from celery import Celery
from celery_heimdall import HeimdallTask
from celery_once import QueueOnce
from celery_singleton import Singleton

from celery_redislock import LockedTask, signals

BASE = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
LOCK_URL = f"{BASE}/0"
BROKER_URL = f"{BASE}/1"
BACKEND_URL = f"{BASE}/2"
RECORD_URL = f"{BASE}/3"

#: How long a duplicate's body runs, in seconds.
DUP_SECONDS = 0.3

app = Celery("redislock_bench", broker=BROKER_URL, backend=BACKEND_URL)
# Extra settings as JSON, to compare settings or another version of the library
# (e.g. BENCH_EXTRA_CONF='{"result_compression": "zlib"}').
app.conf.update(json.loads(os.environ.get("BENCH_EXTRA_CONF") or "{}"))
app.conf.update(
    # Celery's own defaults otherwise; the prefetch multiplier can be changed
    # (BENCH_PREFETCH) to see how much of a no-op's cost is the broker's.
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
    worker_hijack_root_logger=False,
    result_expires=600,
    broker_connection_retry_on_startup=True,
    # celery_redislock: the retry backoff of the test suite (the default,
    # 1 s doubling to 30 s, is tuned for production, not for a 6 s benchmark).
    redislock_url=LOCK_URL,
    redislock_lock_retry_backoff=0.05,
    redislock_lock_retry_backoff_max=0.4,
    # celery-singleton: defaults to the result backend's db otherwise.
    singleton_backend_url=LOCK_URL,
    # celery-once: its documented configuration.
    ONCE={
        "backend": "celery_once.backends.Redis",
        "settings": {"url": LOCK_URL, "default_timeout": 60},
    },
)


class BenchHeimdall(HeimdallTask):  # type: ignore[misc]
    """HeimdallTask on the shared lock db (its documented way: override setup_redis)."""

    abstract = True

    def setup_redis(self) -> redis.Redis:
        return redis.Redis.from_url(LOCK_URL)


# -- overhead: no-op bodies, one distinct argument per call -------------------


@app.task(name="bench.plain_noop")
def plain_noop(i: int) -> int:
    return i


@app.task(name="bench.locked_noop", base=LockedTask, lock_key=["i"])
def locked_noop(i: int) -> int:
    return i


_pinger: Optional[redis.Redis] = None


@app.task(name="bench.two_pings_noop")
def two_pings_noop(i: int) -> int:
    """Plain Celery plus two bare PINGs to the lock store from the pool child: the
    floor of any lock taken and released in the worker (one round trip each)."""
    global _pinger
    if _pinger is None:
        _pinger = redis.Redis.from_url(LOCK_URL)
    _pinger.ping()
    _pinger.ping()
    return i


@app.task(name="bench.singleton_noop", base=Singleton)
def singleton_noop(i: int) -> int:
    return i


@app.task(name="bench.once_noop", base=QueueOnce, once={"graceful": True})
def once_noop(i: int) -> int:
    return i


@app.task(name="bench.heimdall_noop", base=BenchHeimdall, heimdall={"unique": True})
def heimdall_noop(i: int) -> int:
    return i


@app.task(
    name="bench.heimdall_nb_noop",
    base=BenchHeimdall,
    heimdall={"unique": True, "unique_lock_blocking": False},
)
def heimdall_nb_noop(i: int) -> int:
    return i


# -- duplicates: a 0.3 s body that records when it ran -----------------------

_rec: Optional[redis.Redis] = None


def recorder() -> redis.Redis:
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(RECORD_URL)
    return _rec


def body(tag: str, task_id: Optional[str]) -> str:
    start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on the machine
    time.sleep(DUP_SECONDS)
    end = time.monotonic()
    recorder().rpush(f"runs:{tag}", json.dumps({"id": task_id, "start": start, "end": end}))
    return "ran"


def _locked(policy: str) -> Any:
    @app.task(
        name=f"bench.locked_dup_{policy}",
        base=LockedTask,
        bind=True,
        lock_key=["job"],
        on_contention=policy,
        lock_wait_timeout=60,
    )
    def locked_dup(self: Any, job: str, tag: str) -> str:
        return body(tag, self.request.id)

    return locked_dup


locked_dup_skip = _locked("skip")
locked_dup_retry = _locked("retry")
locked_dup_wait = _locked("wait")
locked_dup_fail = _locked("fail")
locked_dup_park = _locked("park")


@app.task(name="bench.plain_dup", bind=True)
def plain_dup(self: Any, job: str, tag: str) -> str:
    return body(tag, self.request.id)


@app.task(name="bench.singleton_dup", base=Singleton, bind=True)
def singleton_dup(self: Any, job: str, tag: str) -> str:
    return body(tag, self.request.id)


@app.task(name="bench.once_dup", base=QueueOnce, bind=True, once={"graceful": True})
def once_dup(self: Any, job: str, tag: str) -> str:
    return body(tag, self.request.id)


@app.task(
    name="bench.heimdall_nb_dup",
    base=BenchHeimdall,
    bind=True,
    heimdall={"unique": True, "unique_lock_blocking": False},
)
def heimdall_nb_dup(self: Any, job: str, tag: str) -> str:
    return body(tag, self.request.id)


def _count_contention(sender: Any = None, request: Any = None, **_: Any) -> None:
    """Count contended attempts per run tag (the ``tag`` argument of a *_dup task)."""
    args = list(getattr(request, "args", None) or [])
    tag = (getattr(request, "kwargs", None) or {}).get("tag") or (args[1] if len(args) > 1 else "")
    if tag:
        recorder().incr(f"contended:{tag}")


signals.lock_contended.connect(_count_contention, weak=False, dispatch_uid="bench-contended")
