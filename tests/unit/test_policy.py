"""Pure policy decisions: contention backoff, owner tokens, the eager policy, and
which budget a re-send counts against."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import Retry
from hypothesis import given
from hypothesis import strategies as st

from celery_redislock.exceptions import BackendUnavailable, LockContended
from celery_redislock.primitives.tokens import new_token
from celery_redislock.tasks.messages import REDIS_ERROR_RETRIES_HEADER, RETRIES_HEADER
from celery_redislock.tasks.owners import holder_task_id, owner_prefix, parse_owner
from celery_redislock.tasks.policies import backoff, effective_policy, retry_later


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


# -- re-sends: contention and an unreachable store counted apart ---------------------


class FakeTask:
    """What retry_later reads of a task: its options, its app's conf, and the
    signature it re-sends (recorded instead of published)."""

    name = "proj.job"

    def __init__(self, **options: Any) -> None:
        self.options = {
            "lock_retry_max": None,
            "lock_redis_error_retries": 10,
            "lock_retry_backoff": 0.1,
            "lock_retry_backoff_max": 0.4,
            **options,
        }
        self.app = SimpleNamespace(conf={})
        self.sent: list[dict[str, Any]] = []

    def lock_option(self, option: str, request: Any = None) -> Any:
        return self.options[option]

    def signature_from_request(self, request: Any, countdown: float, headers: Any) -> Any:
        sent = self.sent
        return SimpleNamespace(apply_async=lambda: sent.append(dict(headers)))


def run_with(**headers: Any) -> Any:
    return SimpleNamespace(id="id-1", headers=dict(headers), is_eager=False)


def contended() -> LockContended:
    return LockContended("lock 'x' is held by task t0", "redislock:{x}:lock", "t0", 100)


def test_an_outage_does_not_use_up_the_contention_budget() -> None:
    """A run that had all its contention retries is still re-sent while the
    store is unreachable, and the re-send keeps its contention count."""
    task = FakeTask(lock_retry_max=3, lock_redis_error_retries=2)
    request = run_with(**{RETRIES_HEADER: 3})
    with pytest.raises(Retry, match="lock store unreachable, retry 1 of 2"):
        retry_later(task, request, BackendUnavailable("down"))
    assert task.sent == [{RETRIES_HEADER: 3, REDIS_ERROR_RETRIES_HEADER: 1}]


def test_contention_does_not_use_up_the_outage_budget() -> None:
    task = FakeTask(lock_retry_max=None, lock_redis_error_retries=2)
    request = run_with(**{REDIS_ERROR_RETRIES_HEADER: 2, RETRIES_HEADER: 7})
    with pytest.raises(Retry, match="lock contended, retry 8 in"):
        retry_later(task, request, contended())
    assert task.sent == [{RETRIES_HEADER: 8, REDIS_ERROR_RETRIES_HEADER: 2}]


def test_after_its_last_re_send_an_unreachable_store_fails_the_run_saying_so() -> None:
    task = FakeTask(lock_retry_max=0, lock_redis_error_retries=2)
    request = run_with(**{REDIS_ERROR_RETRIES_HEADER: 2})
    with pytest.raises(BackendUnavailable) as info:
        retry_later(task, request, BackendUnavailable("Redis unreachable during acquire"))
    message = str(info.value)
    assert "proj.job[id-1]" in message and "after 2 re-sends" in message, message
    assert "lock_redis_error_retries=2" in message and "during acquire" in message, message
    assert task.sent == []


def test_without_a_limit_an_unreachable_store_is_retried_on() -> None:
    task = FakeTask(lock_redis_error_retries=None)
    request = run_with(**{REDIS_ERROR_RETRIES_HEADER: 500})
    with pytest.raises(Retry, match="retry 501 in"):
        retry_later(task, request, BackendUnavailable("down"))
