"""Lock and Semaphore against a model, driven by hypothesis.stateful, on a real Redis.

Both drivers of the lock protocol run the same machine: the sync primitives,
and the asyncio ones (each step awaited in an event loop of the machine's).

Three clients of one name take, release, renew and lose (the lease runs
out, as after a pause) their holds, queue and give up (with or without a
release handing over to them first), and ask again with the token they hold
(a retried call), in whatever order hypothesis picks.  The model says who
holds what; after every step the primitives must agree with it: never more
holders than the limit, a grant exactly when the model has room, fences
rising per name (a hold confirmed again included), and a holder whose lease
ran out told so on release or renewal.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import celery_redislock.asyncio as aio
from celery_redislock import Lock, LockLost, LockNotOwned, Semaphore
from celery_redislock.primitives.protocol import Granted
from celery_redislock.primitives.tokens import new_token

CLIENTS = 3
SETTINGS = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
who = st.integers(min_value=0, max_value=CLIENTS - 1)


class SyncDriver:
    """The machine's steps on the sync primitives."""

    #: Whether a release that finds its lease gone, with no grant since, may
    #: return quietly (as a release sent twice by a retry policy does).
    forgives_unrivalled_release = False

    def __init__(self, url: str) -> None:
        self.client: Any = redis.Redis.from_url(url)

    def make(self, name: str, limit: int) -> Any:
        if limit == 1:
            return Lock(self.client, name, ttl=5.0, renew=False)
        return Semaphore(self.client, name, limit, ttl=5.0, renew=False)

    def run(self, value: Any) -> Any:
        """The outcome of a step: a coroutine's, awaited."""
        return value

    @staticmethod
    def held(status: Any) -> bool:
        """Whether an acquire call's outcome is a grant."""
        return bool(status == 1)

    def close(self) -> None:
        self.client.close()


class AsyncDriver(SyncDriver):
    """The same steps on the asyncio primitives, awaited in one event loop."""

    forgives_unrivalled_release = True

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = self.loop.run_until_complete(self._connect(url))

    @staticmethod
    async def _connect(url: str) -> Any:
        return redis.asyncio.Redis.from_url(url)

    def make(self, name: str, limit: int) -> Any:
        if limit == 1:
            return aio.Lock(self.client, name, ttl=5.0, renew=False)
        return aio.Semaphore(self.client, name, limit, ttl=5.0, renew=False)

    def run(self, value: Any) -> Any:
        return self.loop.run_until_complete(value) if inspect.isawaitable(value) else value

    @staticmethod
    def held(status: Any) -> bool:
        return isinstance(status, Granted)

    def close(self) -> None:
        close = getattr(self.client, "aclose", None) or self.client.close
        self.loop.run_until_complete(close())
        self.loop.close()


def machine(client: redis.Redis, driver: SyncDriver, limit: int) -> type[RuleBasedStateMachine]:
    run = driver.run

    class Holds(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            name = f"stateful-{uuid.uuid4().hex[:8]}"
            self.prims: list[Any] = [driver.make(name, limit) for _ in range(CLIENTS)]
            self.holding: set[int] = set()
            self.expired: set[int] = set()  # held, but the lease ran out
            self.last_fence = 0

        @rule(i=who)
        def acquire(self, i: int) -> None:
            prim = self.prims[i]
            if i in self.holding or i in self.expired:
                return  # the object holds (or believes it holds) already
            got = run(prim.acquire(blocking=False))
            assert got == (len(self.holding) < limit), (got, self.holding)
            if got:
                self.granted(i)

        def granted(self, i: int) -> None:
            fence = self.prims[i].fence
            assert fence > self.last_fence, (fence, self.last_fence)
            self.last_fence = fence
            self.holding.add(i)

        @rule(i=who, handed=st.booleans())
        def wait_then_give_up(self, i: int, handed: bool) -> None:
            """Queue as a blocked acquire() does; then maybe a holder releases
            (and hands over, to this waiter alone in line); then give up, as
            a timed-out acquire() does: held exactly when it was handed over."""
            prim = self.prims[i]
            if i in self.holding or i in self.expired:
                return
            token = new_token(prim.owner)
            if driver.held(run(prim._attempt(token, 60_000))):  # room: granted at once
                assert len(self.holding) < limit, self.holding
                self.granted(i)
                return
            assert len(self.holding) == limit, self.holding
            if handed:
                j = min(self.holding)
                run(self.prims[j].release())
                self.holding.discard(j)
            assert run(prim._give_up(token)) == handed
            if handed:
                self.granted(i)

        @rule(i=who)
        def ask_again(self, i: int) -> None:
            """A retried acquire with the token of the hold (its reply was
            lost): confirmed with a new, higher fence while the lease is live;
            after it ran out, a grant like any other."""
            prim = self.prims[i]
            if i not in self.holding and i not in self.expired:
                return
            token = prim.token
            prim._token = None  # (as if the first reply had never arrived)
            self.expired.discard(i)
            room = i in self.holding or len(self.holding) < limit
            self.holding.discard(i)
            got = driver.held(run(prim._attempt(token, 0)))
            assert got == room, (got, self.holding)
            if got:
                self.granted(i)

        @rule(i=who)
        def renew(self, i: int) -> None:
            prim = self.prims[i]
            if i in self.holding:
                run(prim.extend())
            elif i in self.expired:
                with pytest.raises(LockLost):
                    run(prim.extend())
                self.expired.discard(i)  # (told: it holds nothing now)
            else:
                with pytest.raises(LockNotOwned):
                    run(prim.extend())

        @rule(i=who)
        def release(self, i: int) -> None:
            prim = self.prims[i]
            if i in self.holding:
                run(prim.release())
                self.holding.discard(i)
            elif i in self.expired:
                rivalled = self.last_fence > prim.fence  # granted to another since
                try:
                    run(prim.release())
                except LockLost:
                    pass
                else:
                    # The asyncio driver cannot tell a release its client's
                    # retry policy sent twice from one that found the lease
                    # gone: where nobody was granted it since, it counts as done.
                    if rivalled or not driver.forgives_unrivalled_release:
                        raise AssertionError("a release after the lease ran out went unnoticed")
                self.expired.discard(i)
            else:
                try:
                    run(prim.release())
                except LockNotOwned:
                    pass
                else:
                    raise AssertionError("released what it did not hold")

        @rule(i=who)
        def lease_runs_out(self, i: int) -> None:
            if i not in self.holding:
                return
            prim = self.prims[i]
            if limit == 1:
                client.pexpire(prim.key, 1)
            else:  # its holder entry's score is its lease's end
                client.zadd(prim.keys.holders, {prim.token: 0}, xx=True)
            time.sleep(0.003)
            self.holding.discard(i)
            self.expired.add(i)

        @invariant()
        def agrees_with_the_model(self) -> None:
            owned = {i for i, p in enumerate(self.prims) if p.token is not None and run(p.owned())}
            assert owned == self.holding, (owned, self.holding)
            assert len(owned) <= limit

        def teardown(self) -> None:
            for i in self.holding:
                run(self.prims[i].release())

    return Holds


@pytest.fixture(params=[SyncDriver, AsyncDriver], ids=["sync", "asyncio"])
def driver(request: pytest.FixtureRequest, r: redis.Redis, redis_url: str) -> Iterator[SyncDriver]:
    made = request.param(redis_url)
    yield made
    made.close()


def test_a_lock_agrees_with_its_model(r: redis.Redis, driver: SyncDriver) -> None:
    run_state_machine_as_test(machine(r, driver, 1), settings=SETTINGS)


def test_a_semaphore_of_2_agrees_with_its_model(r: redis.Redis, driver: SyncDriver) -> None:
    run_state_machine_as_test(machine(r, driver, 2), settings=SETTINGS)
