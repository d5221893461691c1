"""The app of the config-only project, and its tasks (none names the library).

``cfg.plain.*`` are ``@app.task``; ``cfg.shared.*`` are ``@shared_task``;
``cfg.custom`` has a base class of its own, with its own ``__call__`` and
request class.  Bodies record ``{id, start, end, seq, sent}`` into
``runs:<tag>`` on db 3, as the other test apps do.
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery, Task, shared_task
from celery.worker.request import Request

app = Celery("configured")
app.config_from_object("tests.configured.celeryconfig")

_rec: redis.Redis | None = None


def record(task: Task, tag: str, duration: float, **extra: object) -> str:
    global _rec
    start = time.monotonic()
    time.sleep(duration)
    end = time.monotonic()
    if _rec is None:
        _rec = redis.Redis.from_url(f"{app.conf.broker_url.rsplit('/', 1)[0]}/3")
    headers = getattr(task.request, "headers", None) or {}
    sent = task.request.get("redislock_sent") or headers.get("redislock_sent")
    _rec.rpush(
        f"runs:{tag}",
        json.dumps(
            {
                "id": task.request.id,
                "start": start,
                "end": end,
                "pid": os.getpid(),
                "fence": getattr(task.request, "lock_fence", None),
                "sent": sent,
                **extra,
            }
        ),
    )
    return task.request.id


@app.task(name="cfg.plain.skip", bind=True)
def plain_skip(self: Task, job: str, tag: str, duration: float = 0.3) -> str:
    return record(self, tag, duration)


@app.task(name="cfg.plain.park", bind=True)
def plain_park(self: Task, job: str, tag: str, seq: int, duration: float = 0.1) -> str:
    return record(self, tag, duration, seq=seq)


@app.task(name="cfg.plain.coded", bind=True, on_contention="fail")
def plain_coded(self: Task, job: str, tag: str, duration: float = 0.3) -> str:
    return record(self, tag, duration)


@app.task(name="cfg.plain.slow", bind=True)
def plain_slow(self: Task, job: str, tag: str, duration: float = 30.0) -> str:
    return record(self, tag, duration)


@app.task(name="cfg.unique", bind=True)
def unique(self: Task, job: str, tag: str, duration: float = 0.3) -> str:
    return record(self, tag, duration)


@shared_task(name="cfg.shared.skip", bind=True)
def shared_skip(self: Task, job: str, tag: str, duration: float = 0.3) -> str:
    return record(self, tag, duration)


@shared_task(name="cfg.shared.park", bind=True)
def shared_park(self: Task, job: str, tag: str, seq: int, duration: float = 0.1) -> str:
    return record(self, tag, duration, seq=seq)


class TracedRequest(Request):
    """A request class of the project's own base."""

    traced = True


class CustomBase(Task):
    """A base class of the project's own, with its own __call__ and Request."""

    Request = TracedRequest

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.request.custom_called = True
        return super().__call__(*args, **kwargs)


@app.task(name="cfg.custom", bind=True, base=CustomBase)
def custom(self: Task, job: str, tag: str, duration: float = 0.3) -> str:
    return record(self, tag, duration, custom=bool(self.request.get("custom_called")))
