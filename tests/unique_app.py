"""Unique-job tasks for the worker tests (tests/integration/test_unique_*.py).

They live on tests.celery_app's app (same layout: locks db 0, broker db 1,
results db 2, recordings db 3), so a worker started with
``-A tests.unique_app`` runs these and the others; bodies record with
``probe`` under ``runs:<tag>``.
"""

from __future__ import annotations

import time

from celery_redislock import LockedTask
from tests.celery_app import app, probe, record

__all__ = ["app"]


def _task(name: str, **options: object):
    options = {"lock_key": ["job"], "on_contention": "retry", **options}

    @app.task(name=name, base=LockedTask, **options)
    def job(job: str, tag: str, duration: float = 0.2, seq: int = 0):
        return probe(tag, duration, job=job, seq=seq)

    return job


#: until_finished, duplicates returned (the default on_duplicate).
finished = _task("u.finished", unique="until_finished")
#: until_finished, duplicates raise AlreadyQueued.
finished_raise = _task("u.finished_raise", unique="until_finished", on_duplicate="raise")
#: until_started, with a run lock that parks: celery-once's "one running, one queued".
started_park = _task("u.started_park", unique="until_started", on_contention="park")
#: coalesce: one waiting, one running per key.
coalesce = _task("u.coalesce", unique="coalesce", on_contention="park")
#: until_started, a later publish replaces the waiting job.
replacing = _task("u.replace", unique="until_started", on_duplicate="replace")
#: the same, parking when its lock is held.
replacing_park = _task(
    "u.replace_park", unique="until_started", on_duplicate="replace", on_contention="park"
)
#: debounced: only the last publish of a burst runs.
debounced = _task("u.debounce", debounce=0.8)
#: throttled: one accepted publish per key per window.
throttled = _task("u.throttle", throttle=1.0)
#: acks_late, a short lease: the message outlives a worker killed mid-run.
late = _task("u.late", unique="until_finished", acks_late=True, lock_ttl=1.5)
#: a short lease: renewal keeps its key while it runs; a dead run's key lapses.
short_lease = _task("u.short_lease", unique="until_finished", lock_ttl=1.0)


@app.task(
    name="u.retrying",
    base=LockedTask,
    bind=True,
    lock_key=["job"],
    unique="until_finished",
    max_retries=1,
)
def retrying(self, job: str, tag: str, countdown: float = 1.0, times: int = 1, limit: int = 9):
    """Retries itself ``times`` times (self.retry, at most ``limit``), then succeeds."""
    out = probe(tag, 0.05, job=job)
    if self.request.retries < times:
        raise self.retry(countdown=countdown, max_retries=limit)
    return out


@app.task(
    name="u.requeue",
    base=LockedTask,
    bind=True,
    lock_key=["job"],
    unique="until_finished",
    acks_late=True,
)
def requeue(self, job: str, tag: str):
    """Rejects its first delivery back to the queue (Reject(requeue=True))."""
    from celery.exceptions import Reject

    out = probe(tag, 0.05, job=job, redelivered=bool(self.request.delivery_info.get("redelivered")))
    if not record_once(f"requeued:{tag}"):
        raise Reject("back to the queue", requeue=True)
    return out


def record_once(flag: str) -> bool:
    """False the first time ``flag`` is seen (in any process), True after."""
    from tests.celery_app import recorder

    return not recorder().set(flag, "1", nx=True)


@app.task(
    name="u.stuck",
    base=LockedTask,
    lock_key=["job"],
    unique="until_finished",
    time_limit=1.0,
)
def stuck(job: str, tag: str, duration: float = 5.0):
    """Outlives its hard time limit: the worker's main process kills it."""
    record(tag, event="start", at=time.monotonic())
    time.sleep(duration)
