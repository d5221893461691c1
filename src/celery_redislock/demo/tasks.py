"""The demo's app and tasks: one per contention policy or feature.

- ``sync_user(user_id)``: a lock per user, duplicates retried: every sync runs,
  one at a time per user.
- ``rebuild_report()``: one lock for the task, duplicates skipped (``TaskSkipped``).
- ``post_entry(ledger, n)``: duplicates parked: every run happens, in the order sent,
  without holding a worker slot while it waits.
- ``call_partner(n)``: at most two at once (a semaphore), others wait.
- ``set_balance(account, balance)``: a write checked against the lock's fencing token.
- ``refresh_feed(feed)``: a unique job: publishing it again while it waits or runs
  sends nothing.
- ``notify(n)``: at most four starts a second across every worker; the rest are
  deferred, each to a slot of its own.

Every body records its start and end (``records.note``); the lock's signals record
contentions and lost leases.  Run your own worker on them with
``REDIS_URL=redis://host:6379/0 celery -A celery_redislock.demo.tasks worker``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any, Optional

from celery import Celery

from celery_redislock import LockedTask, signals

from . import config
from .records import FencedStore, client, note

app = Celery("demo")
app.conf.update(config.settings())

#: ``app.task``, typed: Celery ships no annotations, and mypy checks this package.
task: Callable[..., Callable[[Callable[..., Any]], Any]] = app.task


def _run(task: Any, seconds: float, **fields: Any) -> None:
    note("start", task=task.name, id=task.request.id, pid=os.getpid(), **fields)
    time.sleep(seconds)
    note("end", task=task.name, id=task.request.id, **fields)


@task(base=LockedTask, bind=True, name="demo.sync_user", lock_key=["user_id"],
          on_contention="retry")  # fmt: skip
def sync_user(self: Any, user_id: int) -> str:
    _run(self, 0.5, user=user_id)
    return f"user {user_id} synced"


@task(base=LockedTask, bind=True, name="demo.rebuild_report", on_contention="skip")
def rebuild_report(self: Any, seconds: float = 1.0, until: Optional[str] = None) -> str:
    """Takes ``seconds``; or, given ``until``, runs until that Redis key exists
    (an operator's stuck run, ended by the demo once it has been freed)."""
    fence = self.request.lock_fence
    note("start", task=self.name, id=self.request.id, pid=os.getpid(), fence=fence)
    deadline = time.monotonic() + (30.0 if until else seconds)
    while time.monotonic() < deadline and not (until and client().exists(until)):
        time.sleep(0.05)
    note("end", task=self.name, id=self.request.id)
    return "report rebuilt"


@task(base=LockedTask, bind=True, name="demo.post_entry", lock_key=["ledger"],
          on_contention="park")  # fmt: skip
def post_entry(self: Any, ledger: str, n: int, seconds: float = 0.1) -> str:
    _run(self, seconds, n=n)
    return f"entry {n} posted to {ledger}"


@task(base=LockedTask, bind=True, name="demo.call_partner", semaphore=2,
          on_contention="wait")  # fmt: skip
def call_partner(self: Any, n: int) -> str:
    _run(self, 0.4, n=n)
    return f"call {n} done"


@task(base=LockedTask, bind=True, name="demo.set_balance", lock_key=["account"],
          on_contention="wait", lock_ttl=1.0)  # fmt: skip
def set_balance(self: Any, account: str, balance: int, stall: bool = False) -> str:
    fence = self.request.lock_fence
    note("start", task=self.name, id=self.request.id, fence=fence)
    if stall:
        # A stall longer than the lease (a GC pause, a frozen VM): the whole
        # process stops, lease renewal included, until the demo sends SIGCONT.
        client().set("demo:stalled", os.getpid())
        os.kill(os.getpid(), signal.SIGSTOP)
    ok, newest = FencedStore(client()).write(f"balance:{account}", str(balance), fence)
    note("end", task=self.name, id=self.request.id, written=ok, fence=fence)
    return f"balance {balance} " + (
        f"written with fence {fence}" if ok else f"refused: fence {fence} < {newest}"
    )


@task(base=LockedTask, bind=True, name="demo.refresh_feed", lock_key=["feed"],
          unique="until_finished")  # fmt: skip
def refresh_feed(self: Any, feed: str) -> str:
    _run(self, 0.5, feed=feed)
    return f"feed {feed} refreshed"


@task(base=LockedTask, bind=True, name="demo.notify", global_rate_limit="4/s")
def notify(self: Any, n: int) -> str:
    _run(self, 0.0, n=n)
    return f"notification {n} sent"


def _contended(sender: Any = None, request: Any = None, holder: Any = None, **kw: Any) -> None:
    note("contended", task=sender.name, id=request.id, holder=holder, policy=kw.get("policy"))


def _rate_limited(sender: Any = None, request: Any = None, **kw: Any) -> None:
    note("rate limited", task=sender.name, id=request.id, delay=kw.get("delay"))


def _lost(sender: Any = None, key: str = "", reason: str = "", **kw: Any) -> None:
    note("lock lost", key=key, reason=reason)


signals.lock_contended.connect(_contended, weak=False, dispatch_uid="redislock-demo-contended")
signals.lock_lost.connect(_lost, weak=False, dispatch_uid="redislock-demo-lost")
signals.rate_limited.connect(_rate_limited, weak=False, dispatch_uid="redislock-demo-rate-limited")
