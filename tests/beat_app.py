"""A Celery app whose beat schedule fires tasks faster than they run.

Beat publishes through the same apply_async/send_task path as any producer;
the tests check the lock holds for scheduled runs too, and that a unique job
named in ``redislock_tasks`` is queued once at a time.  Layout as in
celery_app.py (REDISLOCK_TEST_REDIS; broker db 1, results db 2, locks db 0,
recordings db 3).
"""

from __future__ import annotations

import os

from celery import Celery

from celery_redislock import ConfiguredLocks, LockedTask
from tests.celery_app import body

BASE = os.environ.get("REDISLOCK_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")
TAG = os.environ.get("REDISLOCK_TEST_BEAT_TAG", "beat")

app = Celery("redislock_beat", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redislock_url=f"{BASE}/0",
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        "every-0.2s": {"task": "b.scheduled", "schedule": 0.2, "args": (TAG, 0.5)},
        "unique-every-0.2s": {"task": "b.configured", "schedule": 0.2, "args": (TAG, 0.5)},
    },
    task_annotations=[ConfiguredLocks()],
    redislock_tasks={"b.configured": {"unique": "until_finished", "on_contention": "skip"}},
)


@app.task(name="b.scheduled", base=LockedTask, bind=True, on_contention="skip", shared=False)
def scheduled(self, tag: str, duration: float = 0.5):
    return body(self, tag, duration)


@app.task(name="b.configured", bind=True, shared=False)
def configured(self, tag: str, duration: float = 0.5):
    return body(self, f"{tag}-unique", duration)
