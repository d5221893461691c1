"""Pure policy decisions: contention backoff, owner tokens, the eager policy."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_redislock.primitives.tokens import new_token
from celery_redislock.tasks.owners import holder_task_id, owner_prefix, parse_owner
from celery_redislock.tasks.policies import backoff, effective_policy


class Fixed:
    """A stand-in for random.Random that always returns ``value``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@given(
    attempt=st.integers(min_value=0, max_value=10_000),
    base=st.floats(min_value=0.001, max_value=60),
    cap=st.floats(min_value=0.001, max_value=3600),
    seed=st.integers(),
)
def test_backoff_is_between_half_and_all_of_the_capped_exponential(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    ceiling = min(cap, base * 2.0 ** min(attempt, 1000))
    delay = backoff(attempt, base, cap, random.Random(seed))  # type: ignore[arg-type]
    assert ceiling / 2 <= delay <= ceiling


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [(0, 0.05, 0.1), (1, 0.1, 0.2), (2, 0.2, 0.4), (3, 0.2, 0.4), (50, 0.2, 0.4)],
)
def test_backoff_ends_of_the_range(attempt: int, low: float, high: float) -> None:
    assert backoff(attempt, 0.1, 0.4, Fixed(0.0)) == pytest.approx(low)  # type: ignore[arg-type]
    assert backoff(attempt, 0.1, 0.4, Fixed(1.0)) == pytest.approx(high)  # type: ignore[arg-type]


def test_backoff_huge_attempt_does_not_overflow() -> None:
    assert backoff(10**9, 1.0, 30.0, Fixed(0.5)) == pytest.approx(22.5)  # type: ignore[arg-type]


def test_backoff_spreads_duplicates() -> None:
    """Jitter: twenty runs that collided at once do not all come back at once."""
    rng = random.Random(1)
    delays = {round(backoff(3, 1.0, 30.0, rng), 6) for _ in range(20)}  # type: ignore[arg-type]
    assert len(delays) == 20
    assert min(delays) >= 4.0 and max(delays) <= 8.0


@pytest.mark.parametrize("hostname", ["celery@worker-1", "", None, "w@h.example.com"])
@pytest.mark.parametrize("task_id", ["d6a1be3e-bd40-4047-92a9-6b1712cc7c6e", "custom-id"])
def test_owner_prefix_round_trips_the_task_id(task_id: str, hostname: str) -> None:
    prefix = owner_prefix(task_id, hostname, 4321, "proj.sync")
    assert prefix == f"{task_id}|{hostname or ''}|4321|proj.sync|"
    token = new_token(prefix)
    assert token.startswith(prefix) and len(token) > len(prefix)
    assert holder_task_id(token) == task_id
    assert holder_task_id(prefix) == task_id
    assert parse_owner(token) == (task_id, "proj.sync", hostname or None, 4321)


@pytest.mark.parametrize(
    ("token", "owner"),
    [
        ("t1|w@h|7|a|b|ab12", ("t1", "a|b", "w@h", 7)),  # a name with the separator
        ("t1|w@h|7|ab12", ("t1", None, "w@h", 7)),  # no task name
        ("plain-owner-token", (None, None, None, None)),
        ("a|b|not-a-pid|c|d", (None, None, None, None)),
    ],
)
def test_parse_owner_reads_what_a_token_says(token: str, owner: tuple[object, ...]) -> None:
    assert parse_owner(token) == owner


def test_owner_prefixes_of_different_runs_do_not_prefix_each_other() -> None:
    """The reaper frees tokens starting with one run's prefix: never another run's."""
    a = owner_prefix("task-1", "w@h", 12)
    others = [
        owner_prefix("task-1", "w@h", 123),
        owner_prefix("task-1", "w@h2", 12),
        owner_prefix("task-12", "w@h", 12),
        owner_prefix("task-1", "w@h", 1),
    ]
    for other in others:
        assert not new_token(other).startswith(a)
        assert not new_token(a).startswith(other)


def test_holder_task_id_of_non_task_holders() -> None:
    assert holder_task_id(None) is None
    assert holder_task_id("plain-owner-token") == "plain-owner-token"
    assert holder_task_id("") == ""


@pytest.mark.parametrize(
    ("policy", "eager", "expected"),
    [
        ("retry", False, "retry"),
        ("retry", True, "wait"),
        ("skip", True, "skip"),
        ("wait", True, "wait"),
        ("fail", True, "fail"),
        ("skip", False, "skip"),
        ("wait", False, "wait"),
    ],
)
def test_effective_policy(policy: str, eager: bool, expected: str) -> None:
    assert effective_policy(policy, eager) == expected
