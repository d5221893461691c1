"""The demo's scenarios: publish to the worker, wait for the outcomes, measure.

Each prints what it does and returns its :class:`~.checks.Check`, measured
from what the runs recorded in Redis (``records``) and what Celery returned,
never from how long something took.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any, Optional

import redis
from celery.signals import before_task_publish

from celery_redislock import TaskSkipped
from celery_redislock.ops.inspect import Inspector

from . import checks, tasks
from .processes import redislock
from .records import FencedStore, events

TIMEOUT = 30.0


def wait_for(what: str, found: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Poll ``found()`` until it returns something truthy; RuntimeError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := found()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def started(r: redis.Redis, task_id: str) -> Optional[dict[str, Any]]:
    return next((e for e in events(r) if e["event"] == "start" and e.get("id") == task_id), None)


def of(r: redis.Redis, task: Any, ids: set[str]) -> list[dict[str, Any]]:
    """The events of ``task``'s runs among ``ids``, in Redis's order."""
    return [e for e in events(r, task.name) if e.get("id") in ids]


def retry(r: redis.Redis) -> checks.Check:
    print('\n1) retry: sync_user, lock_key=["user_id"], on_contention="retry"')
    print("   3 x sync_user(42) and 1 x sync_user(7) at once")
    results = [tasks.sync_user.delay(u) for u in (42, 42, 42, 7)]
    for res in results:
        res.get(timeout=TIMEOUT)
    seen = of(r, tasks.sync_user, {res.id for res in results})
    retries = sum(1 for e in seen if e["event"] == "contended" and e["policy"] == "retry")
    same_user = [e for e in seen if e.get("user") == 42]
    return checks.retry(len(checks.starts(seen)), 4, checks.peak_overlap(same_user), retries)


def skip(r: redis.Redis, n: int = 5) -> checks.Check:
    print('\n2) skip: rebuild_report, one lock for the task, on_contention="skip"')
    print(f"   {n} x rebuild_report() at once")
    results = [tasks.rebuild_report.delay() for _ in range(n)]
    values = [res.get(timeout=TIMEOUT, propagate=False) for res in results]
    skipped = sum(isinstance(v, TaskSkipped) for v in values)
    ran = len(checks.starts(of(r, tasks.rebuild_report, {res.id for res in results})))
    return checks.skip(ran, skipped, n)


def park(r: redis.Redis, n: int = 5) -> checks.Check:
    print('\n3) park: post_entry, lock_key=["ledger"], on_contention="park"')
    print(f"   post_entry(n=0) holds the ledger's lock; n=1..{n} are sent while it runs")
    first = tasks.post_entry.delay("ledger-1", 0, seconds=1.0)
    wait_for("post_entry(n=0) to start", lambda: started(r, first.id))
    results = [first] + [tasks.post_entry.delay("ledger-1", i) for i in range(1, n + 1)]
    for res in results:
        res.get(timeout=TIMEOUT)
    seen = of(r, tasks.post_entry, {res.id for res in results})
    parked = {e["id"] for e in seen if e["event"] == "contended" and e["policy"] == "park"}
    order, peak = checks.starts(seen), checks.peak_overlap(seen)
    return checks.park(order, list(range(n + 1)), len(parked), peak)


def semaphore(r: redis.Redis, n: int = 6, limit: int = 2) -> checks.Check:
    print(f'\n4) semaphore: call_partner, semaphore={limit}, on_contention="wait"')
    print(f"   {n} x call_partner() at once, on 4 worker processes")
    results = [tasks.call_partner.delay(i) for i in range(n)]
    for res in results:
        res.get(timeout=TIMEOUT)
    seen = of(r, tasks.call_partner, {res.id for res in results})
    return checks.semaphore(limit, checks.peak_overlap(seen), len(checks.starts(seen)), n)


def fence(r: redis.Redis) -> checks.Check:
    print('\n5) fence: set_balance, lock_key=["account"], lock_ttl=1, fenced writes')
    print("   A takes the lock and stalls (SIGSTOP) past its 1 s lease; B waits, gets the")
    print("   lock, writes 200; A wakes up and writes 100 with its old fence")
    a = tasks.set_balance.delay("acct-1", 100, stall=True)
    pid = wait_for("set_balance A to stall", lambda: r.get("demo:stalled"))
    try:
        b = tasks.set_balance.delay("acct-1", 200)
        print(f"   B -> {b.get(timeout=TIMEOUT)}")
    finally:
        os.kill(int(pid), signal.SIGCONT)  # wake A whatever happened
    print(f"   A -> {a.get(timeout=TIMEOUT)}")
    ends = {e["id"]: e for e in events(r, tasks.set_balance.name) if e["event"] == "end"}
    stale, newer = ends.get(a.id, {}), ends.get(b.id, {})
    return checks.fence(
        stale.get("fence"), stale.get("written"), newer.get("fence"),
        FencedStore(r).read("balance:acct-1"),
    )  # fmt: skip


def unique(r: redis.Redis, n: int = 5) -> checks.Check:
    print('\n6) unique: refresh_feed, lock_key=["feed"], unique="until_finished"')
    print(f'   {n} x refresh_feed("news") at once')
    sent: list[str] = []

    def count(sender: Any = None, **kw: Any) -> None:
        if sender == tasks.refresh_feed.name:
            sent.append(sender)

    before_task_publish.connect(count, weak=False, dispatch_uid="redislock-demo-count")
    try:
        results = [tasks.refresh_feed.delay("news") for _ in range(n)]
    finally:
        before_task_publish.disconnect(dispatch_uid="redislock-demo-count")
    jobs = {res.id for res in results}
    results[0].get(timeout=TIMEOUT)
    runs = len(checks.starts(of(r, tasks.refresh_feed, jobs)))
    return checks.unique(n, len(sent), len(jobs), runs)


def rate(r: redis.Redis, n: int = 8, per_second: int = 4) -> checks.Check:
    print(f'\n7) rate: notify, global_rate_limit="{per_second}/s", on_rate_limited="defer"')
    print(f"   {n} x notify() at once, on 4 worker processes")
    results = [tasks.notify.delay(i) for i in range(n)]
    for res in results:
        res.get(timeout=TIMEOUT)
    seen = of(r, tasks.notify, {res.id for res in results})
    times = sorted(e["at"] for e in seen if e["event"] == "start")
    deferred = [e["id"] for e in seen if e["event"] == "rate limited"]
    return checks.rate(len(times), n, checks.busiest_second(times), per_second, deferred)


def operating(r: redis.Redis) -> checks.Check:
    print("\n8) operating: find a stuck lock, and free it")
    print("   rebuild_report runs on and on; `ls` names its holder, `release` frees it")
    stuck = tasks.rebuild_report.delay(until="demo:go")
    run = wait_for("the stuck rebuild_report to start", lambda: started(r, stuck.id))
    print(indent(redislock("ls", "--kind", "lock")))
    holders = [h for e in Inspector.from_app(tasks.app).entries(kind="lock")
               if e.name == tasks.rebuild_report.name for h in e.holders]  # fmt: skip
    listed = (
        {"task": holders[0].task_name, "task_id": holders[0].task_id, "pid": holders[0].pid}
        if len(holders) == 1
        else None
    )
    released = redislock("release", tasks.rebuild_report.name, "--yes")
    print(indent(released))
    fences = re.search(r"new fence (\d+) \(was (\d+)\)", released)
    new, old = (int(fences[1]), int(fences[2])) if fences else (0, 0)
    try:
        after = tasks.rebuild_report.delay(seconds=0.1).get(timeout=TIMEOUT, propagate=False)
        print(f"   the next rebuild_report -> {after!r}")
    finally:
        r.set("demo:go", 1)  # the stuck run may end now
    stuck.get(timeout=TIMEOUT, propagate=False)

    def lost() -> list[dict[str, Any]]:
        return [
            e
            for e in events(r)
            if e["event"] == "lock lost" and tasks.rebuild_report.name in e["key"]
        ]

    # The freed run learns of its loss as its release's reply comes back,
    # which may be after its result is stored.
    try:
        reports = wait_for("the freed run's lock_lost", lost, timeout=5.0)
    except RuntimeError:
        reports = []
    for e in reports:
        print(f"   the freed run's worker reported lock_lost: {e['reason']}")
    next_ran = after == "report rebuilt"
    return checks.operating(listed, run, old, new, next_ran)


def indent(text: str) -> str:
    return "\n".join("   " + line for line in text.splitlines())


ALL = (retry, skip, park, semaphore, fence, unique, rate, operating)
