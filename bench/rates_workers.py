"""The worker part of bench/rates.py: a backlog of runs under one global rate, on real workers.

Two ``celery worker -P prefork -c 4`` subprocesses (``bench/rates_app.py``)
share one private redis-server.  Per variant, a backlog of ``runs`` (200)
runs of a task limited to 20/s is sent at once, and the bodies record their
starts.  Figures per variant:

* the time from the first start to the last, against the ideal
  ``(runs - 1) / 20`` s (one start every 50 ms from the first), and from the
  first publish to the last start;
* the largest number of starts in any half-open 1 s window (the limit: 20);
* messages per run: as published (every process) and as received by the
  workers, per task id (a deferred or retried run keeps its id), with the
  most any one run took;
* runs that started more than once, and runs that never started within the
  time allowed.

Variants: LockedTask ``global_rate_limit="20/s"`` with ``on_rate_limited``
``"defer"`` (the default) and ``"wait"``; Celery's own ``rate_limit="20/s"``
(a token bucket per worker, so two workers allow twice the rate); and
celery-heimdall's ``heimdall={"rate_limit": RateLimit((20, 1)), "key": ...}``, run last (its retries
may still be pending when it is cut off).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from bisect import bisect_left
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Optional

import redis
from common import ROOT, log

#: Workers and pool processes per worker.
WORKERS, CONCURRENCY = 2, 4
#: Runs per variant in the unmeasured warm-up.
WARMUP = 8


@dataclass
class Backlog:
    label: str
    task_name: str
    runs: int = 0
    sent_at: float = 0.0
    starts: list[dict[str, Any]] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    #: Task id -> the moment of the slot it took, for the runs of ours that waited for one.
    slots: dict[str, float] = field(default_factory=dict)
    note: str = ""

    @property
    def first_starts(self) -> dict[str, float]:
        first: dict[str, float] = {}
        for s in self.starts:
            first.setdefault(s["id"], s["t"])
        return first

    @property
    def times(self) -> list[float]:
        return sorted(self.first_starts.values())

    def slot_times(self) -> list[float]:
        """Each run's slot: the one it waited for, or (a run that found one
        free at once) its start, which came just after it."""
        return sorted(self.slots.get(i, t) for i, t in self.first_starts.items())


def largest_window(times: list[float], span: float = 1.0) -> int:
    """The most of ``times`` (sorted) in any half-open window ``[t, t + span)``."""
    return max((bisect_left(times, t + span) - bisect_left(times, t) for t in times), default=0)


class Cluster:
    def __init__(self, base: str) -> None:
        from tests.workers import Worker

        self.m = import_module("rates_app")
        self.rec = redis.Redis.from_url(self.m.RECORD_URL)
        self.locks = redis.Redis.from_url(self.m.LOCK_URL)
        self.workers = [
            Worker(
                base,
                CONCURRENCY,
                name=f"rates{i + 1}",
                app="rates_app",
                env={"BENCH_REDIS": base, "PYTHONPATH": _path()},
            )
            for i in range(WORKERS)
        ]
        for w in self.workers:
            w.wait_ready(60)

    def stop(self) -> None:
        for w in self.workers:
            w.stop()

    def backlog(self, b: Backlog, n: int, timeout: float) -> Backlog:
        self.locks.flushdb()
        self.rec.flushdb()
        task = self.m.app.tasks[b.task_name]
        tag = f"{b.task_name}-{uuid.uuid4().hex[:8]}"
        key = f"starts:{tag}"
        b.runs = n
        b.sent_at = time.time()
        for i in range(n):
            task.apply_async((tag, i))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = {json.loads(x)["id"] for x in self.rec.lrange(key, 0, -1)}
            if len(ids) >= n:
                break
            time.sleep(0.05)
        else:
            b.note = f"cut off after {timeout:.0f} s"
        time.sleep(1.0)  # a second start of any run would show up here
        b.starts = [json.loads(x) for x in self.rec.lrange(key, 0, -1)]
        for kind, into in (("published", b.published), ("received", b.received)):
            counts = self.rec.hgetall(f"{kind}:{b.task_name}")
            into += [int(v) for v in counts.values()]
        slots = self.rec.hgetall(f"slots:{b.task_name}")
        b.slots = {k.decode(): float(v) for k, v in slots.items()}
        return b


def _path() -> str:
    return os.pathsep.join([str(ROOT), str(ROOT / "bench")])


#: Celery's own rate limit last: its runs may still be held in the workers when it is cut off.
VARIANTS = [
    ("LockedTask global_rate_limit, on_rate_limited='defer'", "rates.defer"),
    ("LockedTask global_rate_limit, on_rate_limited='wait'", "rates.wait"),
    ("celery-heimdall RateLimit((20, 1)), one key", "rates.heimdall"),
    ("Celery rate_limit='20/s' (per worker)", "rates.celery"),
]


def run(base: str, n: int) -> list[Backlog]:
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # tests.workers
    os.environ["BENCH_REDIS"] = base  # read by rates_app at import
    log(f"workers: {WORKERS} x -c {CONCURRENCY}, {n} runs per variant at 20/s")
    cluster = Cluster(base)
    try:
        for _, name in VARIANTS:  # imports, connections, scripts in every pool process
            cluster.backlog(Backlog("warm-up", name), WARMUP, 30)
        time.sleep(1.0)  # Celery's token buckets refill
        ideal = (n - 1) / cluster.m.PER_SECOND
        rows = []
        for label, name in VARIANTS:
            b = cluster.backlog(Backlog(label, name), n, timeout=2 * ideal + 5)
            rows.append(b)
            log(f"  {label}: {len(b.times)}/{n} started, {b.note or 'all'}")
        return rows
    finally:
        cluster.stop()


def rows(backlogs: list[Backlog], rate: int) -> list[list[str]]:
    out = []
    for b in backlogs:
        times = b.times
        if not times:
            out.append([b.label, "0", *["-"] * 9, b.note or "nothing started"])
            continue
        ideal = (b.runs - 1) / rate
        span = times[-1] - times[0]
        again = len(b.starts) - len(times)
        notes = [b.note] if b.note else []
        if again:
            notes.append(f"{again} runs started twice")
        out.append([
            b.label,
            f"{len(times)}/{b.runs}",
            f"{span:.2f}",
            f"{span / ideal:.2f}x",
            f"{times[-1] - b.sent_at:.2f}",
            str(largest_window(times)),
            str(largest_window(b.slot_times())) if b.slots else "-",
            _lag(b),
            _per_run(b.published, b.runs),
            _per_run(b.received, b.runs),
            _most(b.received),
            "; ".join(notes) or "-",
        ])  # fmt: skip
    return out


def _lag(b: Backlog) -> str:
    starts = b.first_starts
    lags = sorted((starts[i] - t) * 1000 for i, t in b.slots.items() if i in starts)
    if not lags:
        return "-"
    return f"{lags[len(lags) // 2]:.1f} / {lags[-1]:.1f}"


def _per_run(counts: list[int], runs: int) -> str:
    return f"{sum(counts) / runs:.2f}" if counts else "-"


def _most(counts: list[int]) -> Optional[str]:
    return str(max(counts)) if counts else "-"


HEADER = [
    "variant",
    "runs started",
    "first to last start (s)",
    "vs ideal",
    "publish to last start (s)",
    "largest 1 s window of starts",
    "largest 1 s window of slots",
    "start after its slot, median / max (ms)",
    "messages published/run",
    "messages received/run",
    "most messages for one run",
    "notes",
]
