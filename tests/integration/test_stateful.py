"""Lock and Semaphore against a model, driven by hypothesis.stateful, on a real Redis.

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

import time
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from celery_redislock import Lock, LockLost, LockNotOwned, Semaphore

CLIENTS = 3
SETTINGS = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
who = st.integers(min_value=0, max_value=CLIENTS - 1)


def machine(client: redis.Redis, limit: int) -> type[RuleBasedStateMachine]:
    class Holds(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            name = f"stateful-{uuid.uuid4().hex[:8]}"
            self.prims: list[Any] = [
                Lock(client, name, ttl=5.0, renew=False)
                if limit == 1
                else Semaphore(client, name, limit, ttl=5.0, renew=False)
                for _ in range(CLIENTS)
            ]
            self.holding: set[int] = set()
            self.expired: set[int] = set()  # held, but the lease ran out
            self.last_fence = 0

        @rule(i=who)
        def acquire(self, i: int) -> None:
            prim = self.prims[i]
            if i in self.holding or i in self.expired:
                return  # the object holds (or believes it holds) already
            got = prim.acquire(blocking=False)
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
            token = prim._new_token()
            if prim._attempt(token, 60_000) == 1:  # room: granted at once
                assert len(self.holding) < limit, self.holding
                self.granted(i)
                return
            assert len(self.holding) == limit, self.holding
            if handed:
                j = min(self.holding)
                self.prims[j].release()
                self.holding.discard(j)
            assert prim._give_up(token) == handed
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
            got = prim._attempt(token, 0) == 1
            assert got == room, (got, self.holding)
            if got:
                self.granted(i)

        @rule(i=who)
        def renew(self, i: int) -> None:
            prim = self.prims[i]
            if i in self.holding:
                prim.extend()
            elif i in self.expired:
                with pytest.raises(LockLost):
                    prim.extend()
                self.expired.discard(i)  # (told: it holds nothing now)
            else:
                with pytest.raises(LockNotOwned):
                    prim.extend()

        @rule(i=who)
        def release(self, i: int) -> None:
            prim = self.prims[i]
            if i in self.holding:
                prim.release()
                self.holding.discard(i)
            elif i in self.expired:
                try:
                    prim.release()
                except LockLost:
                    pass
                else:
                    raise AssertionError("a release after the lease ran out went unnoticed")
                self.expired.discard(i)
            else:
                try:
                    prim.release()
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
            owned = {i for i, p in enumerate(self.prims) if p.token is not None and p.owned()}
            assert owned == self.holding, (owned, self.holding)
            assert len(owned) <= limit

        def teardown(self) -> None:
            for i in self.holding:
                self.prims[i].release()

    return Holds


def test_a_lock_agrees_with_its_model(r: redis.Redis) -> None:
    run_state_machine_as_test(machine(r, 1), settings=SETTINGS)


def test_a_semaphore_of_2_agrees_with_its_model(r: redis.Redis) -> None:
    run_state_machine_as_test(machine(r, 2), settings=SETTINGS)
