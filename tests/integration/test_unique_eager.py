"""Eager mode (``task_always_eager``): unique jobs and ``park`` behave as on a worker.

The run happens inside ``apply_async``, in this process; the lock store is
the session's redis-server.  Round trips are counted client-side.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_redislock import LockedTask, config
from celery_redislock.primitives import Lock, keys
from tests.helpers import RoundTrips, counting_client

pytestmark = pytest.mark.usefixtures("no_leaked_leases")


@pytest.fixture
def eager(redis_url: str, r: Any) -> Iterator[Celery]:
    app = Celery(
        "unique_eager", broker="memory://", backend="cache+memory://", set_as_current=False
    )
    app.conf.update(task_always_eager=True, redislock_url=redis_url, redislock_lock_wait_timeout=5)
    yield app
    config.reset(app)


@pytest.fixture
def trips(eager: Celery, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[RoundTrips]:
    client, counted = counting_client(redis_url)
    client.ping()
    real = config.client_for
    monkeypatch.setattr(config, "client_for", lambda app: client if app is eager else real(app))
    yield counted
    client.close()


def test_an_eager_publish_is_unique_too(eager: Celery) -> None:
    seen: list[str] = []

    @eager.task(name="e.finished", base=LockedTask, bind=True, unique="until_finished",
                lock_key=["job"], shared=False)  # fmt: skip
    def finished(self: Any, job: str, again: bool = True) -> str:
        if again:
            # Its own key is held while it runs: a publish now is a duplicate.
            seen.append(finished.apply_async((job, False)).id)
        return self.request.id

    outer = finished.apply_async(("j1",))
    assert outer.get() == outer.id
    assert seen == [outer.id]
    assert finished.unique_holder("j1") is None
    inner = finished.apply_async(("j1", False))  # free again: a new job runs
    assert inner.id != outer.id and inner.get() == inner.id


def test_a_unique_job_s_run_takes_no_more_round_trips_than_a_plain_locked_one(
    eager: Celery, trips: RoundTrips
) -> None:
    @eager.task(name="e.plain", base=LockedTask, lock_key=["job"], shared=False)
    def plain(job: str) -> str:
        return job

    @eager.task(name="e.unique", base=LockedTask, lock_key=["job"], unique="until_finished",
                shared=False)  # fmt: skip
    def unique(job: str) -> str:
        return job

    for task in (plain, unique):  # warm: scripts loaded, connections open
        task.apply_async(("warm",)).get()
    trips.reset()
    plain.apply_async(("p1",)).get()
    assert trips.names() == [["EVALSHA"], ["EVALSHA"]]  # acquire, release
    trips.reset()
    unique.apply_async(("u1",)).get()
    # One more for the publish; the run's start and end ride on the lock's calls.
    assert trips.names() == [["EVALSHA"]] * 3


def test_an_eager_park_waits_for_the_lock_and_leaves_nothing_parked(
    eager: Celery, r: Any, redis_url: str
) -> None:
    @eager.task(name="e.park", base=LockedTask, lock_key=["job"], on_contention="park",
                shared=False)  # fmt: skip
    def parked(job: str) -> float:
        return time.monotonic()

    name = parked.lock_name_for(("j1",), {})
    holder = Lock(r, name, ttl=5)
    assert holder.acquire(blocking=False)
    released = []

    def release_later() -> None:
        time.sleep(0.5)
        released.append(time.monotonic())
        holder.release()

    t = threading.Thread(target=release_later)
    t.start()
    ran_at = parked.apply_async(("j1",)).get()
    t.join()
    assert ran_at >= released[0]
    k = keys.lock_keys("redislock", name)
    assert r.exists(k.lock, k.queue, k.pmsg, k.inflight) == 0
