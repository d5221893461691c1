"""Unique-job options: each is checked at class creation (or at the call), with
errors naming the task, the option and the value; the policy a publish follows."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_redislock import ConfigurationError, LockedTask
from celery_redislock.unique.policy import resolve


@pytest.fixture
def app() -> Celery:
    return Celery("unique_options", broker="memory://", set_as_current=False)


def define(app: Celery, name: str = "u.opts", **options: Any) -> Any:
    @app.task(name=name, base=LockedTask, shared=False, **options)
    def job(user: str, report: str = "daily") -> str:
        return user

    # The class is made as the app's proxy evaluates (a finalized app makes it at once).
    return getattr(job, "_get_current_object", lambda: job)()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"unique": "until_done"}, ["'u.opts'", "unique", "'until_done'", "until_started"]),
        ({"unique": True}, ["'u.opts'", "unique", "True"]),
        ({"unique": "until_started", "debounce": 2, "throttle": 3}, ["debounce=2", "throttle=3"]),
        (
            {"unique": "coalesce", "on_duplicate": "replace"},
            ["'u.opts'", "on_duplicate='replace'", "coalesce"],
        ),
        ({"on_duplicate": "drop", "unique": "until_started"}, ["on_duplicate", "'drop'"]),
        ({"unique_ttl": -1, "unique": "until_started"}, ["unique_ttl", "-1"]),
        ({"debounce": "soon"}, ["debounce", "'soon'"]),
        ({"throttle": 0}, ["throttle", "0"]),
        (
            {"unique": "until_started", "unique_key": ["customer"]},
            ["'u.opts'", "unique_key=['customer']", "'customer'", "user, report"],
        ),
        ({"unique": "until_started", "unique_key": "{customer}"}, ["unique_key='{customer}'"]),
        ({"debounce": 1, "unique": "coalesce"}, ["debounce=1", "coalesce"]),
        ({"debounce": 1, "on_duplicate": "raise"}, ["on_duplicate='raise'", "debounce=1"]),
        ({"throttle": 1, "on_duplicate": "replace"}, ["on_duplicate='replace'", "throttle"]),
        ({"unique": "coalesce", "semaphore": 2}, ["coalesce", "semaphore=2"]),
        ({"unique": "coalesce", "lock_mode": "read"}, ["coalesce", "lock_mode='read'"]),
        (
            {"unique": "coalesce", "lock_key": ["user"], "unique_key": ["report"]},
            ["coalesce", "lock_key=['report']"],
        ),
        ({"uniqe": "until_started"}, ["unknown option uniqe", "unique"]),
        ({"unique_keys": ["user"]}, ["unknown option unique_keys", "unique_key"]),
    ],
)
def test_bad_options_fail_at_class_creation(
    app: Celery, options: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(ConfigurationError) as err:
        define(app, **options)
    for word in words:
        assert word in str(err.value)


def test_good_options_are_accepted(app: Celery) -> None:
    for n, options in enumerate(
        (
            {"unique": "until_started"},
            {"unique": "until_finished", "on_duplicate": "raise", "unique_ttl": 60},
            {"unique": "until_finished", "on_duplicate": "replace"},
            {"unique": "coalesce", "lock_key": ["user"]},
            {"unique": "coalesce", "lock_key": ["user"], "unique_key": ["user"]},
            {"debounce": 0.5, "unique_key": ["user"]},
            {"debounce": 0.5, "unique": "until_finished"},
            {"throttle": 10},
            {"throttle": 10, "unique": "until_finished"},
            {"unique_key": "{user}"},  # unique given per call
        )
    ):
        define(app, f"u.good{n}", **options)


def test_per_call_options_are_checked_before_anything_is_sent(app: Celery) -> None:
    job = define(app, unique="until_started")
    with pytest.raises(ConfigurationError, match=r"per-call option unique.*'sometimes'"):
        job.apply_async(("u1",), redislock={"unique": "sometimes"})
    with pytest.raises(ConfigurationError, match=r"debounce=1.*throttle=2"):
        job.apply_async(("u1",), redislock={"debounce": 1, "throttle": 2})
    with pytest.raises(ConfigurationError, match=r"is not a per-call option.*unique_key"):
        job.apply_async(("u1",), redislock={"unique_key": ["user"]})


def test_the_policy_of_a_publish() -> None:
    assert resolve("t", {}, 60.0, "return") is None
    p = resolve("t", {"unique": "until_finished"}, 60.0, "return")
    assert p is not None
    assert (p.mode, p.ttl, p.on_duplicate, p.replaces) == ("f", 60.0, "return", False)
    # debounce: until_started, replacing, whatever the setting says.
    p = resolve("t", {"debounce": 2}, 60.0, "raise")
    assert p is not None
    assert (p.unique, p.mode, p.replaces, p.debounce) == ("until_started", "s", True, 2.0)
    # a throttle alone: mode '-', and a setting's replace means return there.
    p = resolve("t", {"throttle": 5}, 60.0, "replace")
    assert p is not None
    assert (p.mode, p.on_duplicate, p.throttle) == ("-", "return", 5.0)
    p = resolve("t", {"unique": "coalesce"}, 60.0, "replace")
    assert p is not None and p.on_duplicate == "return"
    p = resolve("t", {"unique": "until_started", "unique_ttl": 5}, 60.0, "return")
    assert p is not None and p.ttl == 5.0


def test_unique_settings_are_checked(app: Celery) -> None:
    from celery_redislock import config

    app.conf.update(redislock_url="redis://localhost:1/0", redislock_unique_ttl=0)
    with pytest.raises(ConfigurationError, match="redislock_unique_ttl"):
        config.settings_for(app)
    config.reset(app)
    app.conf.update(redislock_unique_ttl=30, redislock_on_duplicate="ignore")
    with pytest.raises(ConfigurationError, match=r"redislock_on_duplicate.*'ignore'"):
        config.settings_for(app)
