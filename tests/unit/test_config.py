"""Settings from app.conf: errors name the key as written and the value; the lock store."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import Celery

from celery_redislock import ConfigurationError, config
from celery_redislock.config import Settings, describe_store, from_conf, store


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lock_ttl", 0),
        ("lock_ttl", -1.5),
        ("lock_ttl", float("inf")),
        ("lock_ttl", float("nan")),
        ("lock_ttl", "30"),
        ("lock_ttl", True),
        ("renew_interval", -1),
        ("lock_retry_backoff", 0),
        ("lock_retry_backoff_max", "big"),
        ("lock_retry_max", -1),
        ("lock_retry_max", 2.5),
        ("lock_retry_max", False),
        ("lock_wait_timeout", 0),
        ("socket_timeout", -3),
        ("on_contention", "sometimes"),
        ("on_contention", "RETRY"),
        ("lock_wait_fallback", "skip"),
        ("on_redis_error", "ignore"),
        ("url", ""),
        ("url", 6379),
        ("key_prefix", ""),
        ("semaphores", ["a"]),
        ("semaphores", {"a": 0}),
        ("semaphores", {"a": True}),
        ("park_reserve", -1),
        ("park_sweep_interval", 0),
        ("fence_retention", 0),
    ],
)
def test_bad_value_names_the_key_and_the_value(key: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        from_conf({f"redislock_{key}": value, "broker_url": "redis://h:1/0"})
    message = str(info.value)
    assert f"redislock_{key}" in message
    assert repr(value) in message or (
        isinstance(value, dict) and any(repr(v) in message for v in value.values())
    ), message
    assert isinstance(info.value, ValueError)  # ConfigurationError is also a ValueError


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lock_ttl", 0.5),
        ("renew_interval", None),
        ("lock_retry_max", 0),
        ("on_contention", "skip"),
        ("on_contention", "wait"),
        ("on_contention", "fail"),
        ("semaphores", {"reports": 2}),
    ],
)
def test_good_values_are_taken(key: str, value: Any) -> None:
    settings = from_conf({f"redislock_{key}": value, "broker_url": "redis://h/0"})
    expected = getattr(Settings(), key) if value is None else value
    assert getattr(settings, key) == expected


def test_backoff_max_below_backoff_names_both() -> None:
    with pytest.raises(ConfigurationError) as info:
        from_conf({"redislock_lock_retry_backoff": 5, "redislock_lock_retry_backoff_max": 2})
    message = str(info.value)
    assert "redislock_lock_retry_backoff_max (2)" in message
    assert "redislock_lock_retry_backoff (5)" in message


def test_backoff_max_must_stay_below_the_visibility_timeout() -> None:
    conf = {
        "broker_url": "redis://h:1/0",
        "broker_transport_options": {"visibility_timeout": 20},
        "redislock_lock_retry_backoff_max": 30,
    }
    with pytest.raises(ConfigurationError, match=r"backoff_max \(30\).*visibility_timeout \(20"):
        from_conf(conf)
    conf["redislock_lock_retry_backoff_max"] = 10
    assert from_conf(conf).lock_retry_backoff_max == 10


@pytest.mark.parametrize(
    ("conf", "expected", "source"),
    [
        ({"broker_url": "redis://broker:6379/1"}, "redis://broker:6379/1", "broker_url"),
        ({"broker_url": "rediss://:pw@b:6380/2"}, "rediss://:pw@b:6380/2", "broker_url"),
        ({"broker_url": "redis://a:1/0;redis://b:2/0"}, "redis://a:1/0", "broker_url"),
        (
            {"broker_url": "amqp://guest@rabbit//", "result_backend": "redis://res:6379/2"},
            "redis://res:6379/2",
            "result_backend",
        ),
        (
            {"broker_url": "amqp://rabbit//", "result_backend": "redis+socket:///tmp/r.sock"},
            "unix:///tmp/r.sock",
            "result_backend",
        ),
        (
            {"broker_url": "redis://broker/1", "redislock_url": "redis://locks/0"},
            "redis://locks/0",
            "redislock_url",
        ),
        ({"broker_url": "amqp://guest@rabbit//", "result_backend": "rpc://"}, None, ""),
        ({"broker_url": "memory://"}, None, ""),
        ({}, None, ""),
    ],
)
def test_the_store_is_redislock_url_then_a_redis_broker_then_a_redis_backend(
    conf: dict[str, Any], expected: str | None, source: str
) -> None:
    assert store(conf) == (expected, source)
    assert from_conf(conf).url == expected


def test_without_a_redis_store_the_client_is_refused_saying_how_to_set_one() -> None:
    app = Celery("no-store", broker="amqp://guest@127.0.0.1//", set_as_current=False)
    try:
        assert config.settings_for(app).url is None
        with pytest.raises(ConfigurationError, match=r"redislock_url = 'redis://") as info:
            config.client_for(app)
        assert "amqp" in str(info.value)
    finally:
        app.close()


def test_the_store_is_described_without_its_password() -> None:
    assert describe_store("redis://:s3cret@h:6380/4") == "redis://h:6380/4"
    assert describe_store("rediss://user:s3cret@h/2") == "rediss://user@h:6379/2"
    assert describe_store("unix:///tmp/r.sock?db=3") == "unix:///tmp/r.sock/3"
    assert "s3cret" not in describe_store("redis://user:s3cret@h:1?db=1")


@pytest.mark.parametrize(
    ("key", "suggested"),
    [
        ("redislock_lock_tll", "redislock_lock_ttl"),
        ("redislock_on_contension", "redislock_on_contention"),
        ("redislock_semaphore", "redislock_semaphores"),
    ],
)
def test_an_unknown_redislock_key_is_refused_with_the_closest_name(
    key: str, suggested: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        from_conf({key: 1, "broker_url": "redis://h/0"})
    assert repr(key) in str(info.value)
    assert repr(suggested) in str(info.value)


def test_errors_name_the_key_as_a_namespaced_app_writes_it() -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = "redis://h:6379/0"
        CELERY_REDISLOCK_LOCK_TTL = -1

    app = Celery("namespaced", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    try:
        with pytest.raises(ConfigurationError, match=r"^CELERY_REDISLOCK_LOCK_TTL must be") as e:
            config.settings_for(app)
        assert "-1" in str(e.value)

        class Misspelt(DjangoSettings):
            CELERY_REDISLOCK_LOCK_TTL = 5
            CELERY_REDISLOCK_ON_CONTENSION = "skip"

        app.config_from_object(Misspelt, namespace="CELERY")
        config.reset(app)
        with pytest.raises(ConfigurationError, match="CELERY_REDISLOCK_ON_CONTENSION"):
            config.settings_for(app)
    finally:
        app.close()


def test_redis_error_retries_written_as_none_means_no_limit() -> None:
    """Its default is 10: None, written, is no limit (not "the default")."""
    assert from_conf({"redislock_url": "redis://h"}).redis_error_retries == 10
    conf = {"redislock_url": "redis://h", "redislock_redis_error_retries": None}
    assert from_conf(conf).redis_error_retries is None

    class DjangoSettings:
        CELERY_BROKER_URL = "redis://h:6379/0"
        CELERY_REDISLOCK_REDIS_ERROR_RETRIES = None

    app = Celery("namespaced-none", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    try:
        assert config.settings_for(app).redis_error_retries is None
    finally:
        app.close()


def test_settings_for_reads_app_conf_once_until_reset() -> None:
    app = Celery("config-tests", broker="redis://broker:6379/3", set_as_current=False)
    try:
        first = config.settings_for(app)
        assert first.url == "redis://broker:6379/3"
        app.conf.redislock_lock_ttl = 7
        assert config.settings_for(app) is first  # cached
        config.reset(app)
        assert config.settings_for(app).lock_ttl == 7
        app.conf.redislock_on_contention = "nope"
        config.reset(app)
        with pytest.raises(ConfigurationError, match="redislock_on_contention"):
            config.settings_for(app)
    finally:
        app.close()


def test_client_for_first_use_does_not_deadlock() -> None:
    app = Celery("config-deadlock", broker="redis://127.0.0.1:1/0", set_as_current=False)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(config.client_for(app)), daemon=True)
    thread.start()
    thread.join(2.0)
    # A deadlocked thread holds config._lock for good: later tests of this
    # process would hang on it, so fail loudly here instead.
    alive = thread.is_alive()
    if alive:
        config._lock = threading.Lock()  # let the rest of the session go on
    app.close()
    assert not alive, "client_for() deadlocked on its first call (before settings_for())"
    assert got and got[0].connection_pool.connection_kwargs["port"] == 1


def test_client_is_built_once_per_process() -> None:
    app = Celery("config-client", broker="redis://127.0.0.1:1/0", set_as_current=False)
    try:
        config.settings_for(app)
        client = config.client_for(app)
        assert config.client_for(app) is client
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["port"] == 1 and kwargs["socket_timeout"] == Settings().socket_timeout
    finally:
        app.close()
