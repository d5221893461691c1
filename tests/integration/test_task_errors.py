"""Bad input to LockedTask fails early, naming the task and the option or argument.

Options are checked when Celery creates the task class (a finalized app
creates it at decoration, a lazy one at ``finalize()``); arguments are
checked when a run computes its lock name.  Eager runs in this process, with
the session's Redis as the lock store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_redislock import ConfigurationError, LockedTask


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("errors-tests", set_as_current=False)
    app.conf.update(redislock_url=redis_url)
    app.finalize()
    yield app
    app.close()


def define(app: Celery, name: str, fun: Any = None, **options: Any) -> Any:
    def body(user_id: int, region: str = "eu") -> str:
        return "ran"

    return app.task(name=name, base=LockedTask, shared=False, **options)(fun or body)


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("on_contention", "sometimes", ["on_contention", "'sometimes'", "retry", "skip"]),
        ("lock_ttl", -1, ["lock_ttl", "-1"]),
        ("lock_ttl", "30", ["lock_ttl", "'30'"]),
        ("lock_retry_max", -2, ["lock_retry_max", "-2"]),
        ("lock_wait_fallback", "skip", ["lock_wait_fallback", "'skip'"]),
        ("lock_on_redis_error", "ignore", ["lock_on_redis_error", "'ignore'"]),
        ("lock_name", "", ["lock_name", "''"]),
    ],
)
def test_bad_option_fails_at_definition(
    app: Celery, option: str, value: Any, words: list[str]
) -> None:
    with pytest.raises(ConfigurationError) as info:
        define(app, "errors.bad_option", **{option: value})
    message = str(info.value)
    assert "errors.bad_option" in message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize(
    ("option", "value", "suggested"),
    [
        ("lock_keys", ["user_id"], "lock_key"),
        ("on_contension", "skip", "on_contention"),
        ("lock_tll", 5, "lock_ttl"),
        ("redislock_ttl", 5, "lock_ttl"),
        ("concurency_group", "g", "concurrency_group"),
        ("semaphor", 2, "semaphore"),
    ],
)
def test_a_misspelt_option_is_refused_with_the_closest_name(
    app: Celery, option: str, value: Any, suggested: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        define(app, "errors.misspelt", **{option: value})
    message = str(info.value)
    assert "'errors.misspelt'" in message and option in message, message
    assert f"did you mean {suggested!r}?" in message, message


def test_bad_option_on_a_lazy_app_fails_at_finalize(redis_url: str) -> None:
    lazy = Celery("errors-lazy", set_as_current=False)
    try:

        @lazy.task(name="errors.lazy", base=LockedTask, shared=False, on_contention="never")
        def body() -> None:
            return None

        with pytest.raises(ConfigurationError, match=r"errors\.lazy.*on_contention.*'never'"):
            lazy.finalize()
    finally:
        lazy.close()


@pytest.mark.parametrize(
    ("lock_key", "words"),
    [
        (["user"], ["'user'", "user_id", "region"]),
        (["user_id", "missing"], ["'missing'"]),
        ("account:{account_id}", ["'account_id'"]),
        ("user:{0}", ["{0}", "name the parameter"]),
        ([""], ["parameter names"]),
        (42, ["42"]),
    ],
)
def test_lock_key_naming_a_missing_parameter_fails_at_definition(
    app: Celery, lock_key: Any, words: list[str]
) -> None:
    with pytest.raises(ConfigurationError) as info:
        define(app, "errors.bad_key", lock_key=lock_key)
    message = str(info.value)
    assert "errors.bad_key" in message and "lock_key" in message
    for word in words:
        assert word in message, (word, message)


def test_argument_that_cannot_be_canonicalised(app: Celery) -> None:
    task = define(app, "errors.opaque", lock_key=["user_id"])
    opaque = object()
    with pytest.raises(ConfigurationError) as info:
        task.lock_name_for((opaque,), {})
    message = str(info.value)
    assert "errors.opaque" in message and "user_id" in message and repr(opaque) in message
    # A run fails the same way, before its body, without taking any lock.
    result = task.apply((opaque,))
    assert result.state == "FAILURE"
    assert isinstance(result.result, ConfigurationError)
    assert "errors.opaque" in str(result.result) and "user_id" in str(result.result)


def test_bad_setting_in_app_conf_fails_the_app_as_it_finalizes(redis_url: str) -> None:
    app = Celery("errors-conf", set_as_current=False)
    app.conf.update(redislock_url=redis_url, redislock_on_contention="maybe")
    try:
        define(app, "errors.conf")
        with pytest.raises(ConfigurationError) as info:
            app.finalize()
        assert "redislock_on_contention" in str(info.value)
        assert "'maybe'" in str(info.value)
    finally:
        app.close()


def test_call_with_bad_arguments_names_the_task(app: Celery) -> None:
    task = define(app, "errors.args", lock_key=["user_id"])
    with pytest.raises(TypeError, match=r"errors\.args"):
        task.lock_name_for((), {"region": "us"})
