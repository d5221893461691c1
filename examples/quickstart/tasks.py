"""Quickstart tasks: four ways to use LockedTask.

- ``sync_user(user_id)``: one lock per user; a duplicate comes back later
  (``on_contention="retry"``), so every sync runs, one at a time per user.
- ``rebuild_report()``: one lock for the task; a duplicate is dropped
  (``on_contention="skip"``) and its result names the run that held the lock.
- ``set_balance(account, balance)``: writes to a store that checks the lock's
  fencing token, so a holder that stalled past its lease cannot overwrite a
  newer holder's write.
- ``refresh_feed(feed)``: a unique job (``unique="until_finished"``): while one
  refresh of a feed waits or runs, publishing another sends nothing and
  returns the one already queued.

Every body and every contention appends a line to the Redis list
``quickstart:events`` (see ``note``), which run.py prints.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Celery

from celery_redislock import LockedTask, signals

app = Celery("quickstart")
app.config_from_object("celeryconfig")

EVENTS = "quickstart:events"

_redis: redis.Redis | None = None


def r() -> redis.Redis:
    """This process's client (created lazily: a forked pool child makes its own)."""
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(app.conf.redislock_url, decode_responses=True)
    return _redis


def note(event: str, **fields: Any) -> None:
    r().rpush(EVENTS, json.dumps({"event": event, "at": time.time(), **fields}))


# -- 1. one lock per argument, duplicates retried ------------------------------


@app.task(base=LockedTask, bind=True, lock_key=["user_id"], on_contention="retry")
def sync_user(self, user_id: int) -> str:
    note("start", task="sync_user", args=[user_id], id=self.request.id)
    time.sleep(0.5)  # talk to the slow remote system
    note("end", task="sync_user", args=[user_id], id=self.request.id)
    return f"user {user_id} synced"


# -- 2. one lock for the task, duplicates skipped --------------------------------


@app.task(base=LockedTask, bind=True, on_contention="skip")
def rebuild_report(self, seconds: float = 1.0) -> str:
    note("start", task="rebuild_report", args=[], id=self.request.id)
    time.sleep(seconds)
    note("end", task="rebuild_report", args=[], id=self.request.id)
    return "report rebuilt"


# -- 3. the fencing token guards a downstream write ------------------------------

# KEYS[1] the value, KEYS[2] the highest fence that wrote it; ARGV[1] value,
# ARGV[2] the writer's fence.  Returns {1, fence} when written, {0, newest}
# when refused: a writer with a newer fence has written since.
FENCED_WRITE = """
local newest = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = tonumber(ARGV[2])
if fence < newest then
  return {0, newest}
end
redis.call('SET', KEYS[2], fence)
redis.call('SET', KEYS[1], ARGV[1])
return {1, fence}
"""


class FencedStore:
    """A tiny key-value store that refuses writes older than the last one it took."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.script = client.register_script(FENCED_WRITE)

    def write(self, name: str, value: str, fence: int) -> tuple[bool, int]:
        base = f"quickstart:store:{{{name}}}"  # one hash tag: both keys in one slot
        ok, newest = self.script(keys=[f"{base}:value", f"{base}:fence"], args=[value, fence])
        return bool(ok), int(newest)

    def read(self, name: str) -> str | None:
        return self.client.get(f"quickstart:store:{{{name}}}:value")


@app.task(base=LockedTask, bind=True, lock_key=["account"], on_contention="wait", lock_ttl=1.0)
def set_balance(self, account: str, balance: int, stall: bool = False) -> str:
    fence = self.request.lock_fence
    note("start", task="set_balance", args=[account, balance], id=self.request.id, fence=fence)
    if stall:
        # Simulate a stall longer than the lease (a GC pause, a frozen VM):
        # the whole process stops, lease renewal included, until run.py
        # sends SIGCONT.
        r().set("quickstart:stalled", os.getpid())
        os.kill(os.getpid(), signal.SIGSTOP)
    ok, newest = FencedStore(r()).write(f"balance:{account}", str(balance), fence)
    outcome = f"written with fence {fence}" if ok else f"refused: fence {fence} < {newest}"
    note("end", task="set_balance", args=[account, balance], id=self.request.id, outcome=outcome)
    return f"balance {balance} {outcome}"


# -- 4. a unique job: the same work is never queued twice ---------------------------


@app.task(base=LockedTask, bind=True, lock_key=["feed"], unique="until_finished")
def refresh_feed(self, feed: str) -> str:
    note("start", task="refresh_feed", args=[feed], id=self.request.id)
    time.sleep(0.5)
    note("end", task="refresh_feed", args=[feed], id=self.request.id)
    return f"feed {feed} refreshed"


# -- what the lock did, from the library's signals ---------------------------------


def _contended(sender: Any = None, request: Any = None, holder: Any = None, **kw: Any) -> None:
    note(
        "contended",
        task=sender.name.rsplit(".", 1)[-1],
        args=list(request.args or []),
        id=request.id,
        holder=holder,
        policy=kw.get("policy"),
    )


def _lost(sender: Any = None, key: str = "", reason: str = "", **kw: Any) -> None:
    note("lock lost", key=key, reason=reason)


signals.lock_contended.connect(_contended, weak=False, dispatch_uid="quickstart-contended")
signals.lock_lost.connect(_lost, weak=False, dispatch_uid="quickstart-lost")
