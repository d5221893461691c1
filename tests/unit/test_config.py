"""Settings from app.conf: validation errors name the key and the value; URL defaulting."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import Celery

from celery_redislock import ConfigurationError, config
from celery_redislock.config import DEFAULT_URL, Settings, from_conf


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
    settings = from_conf({f"redislock_{key}": value})
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
    ("broker", "expected"),
    [
        ("redis://broker:6379/1", "redis://broker:6379/1"),
        ("rediss://:pw@broker:6380/2", "rediss://:pw@broker:6380/2"),
        ("redis://a:1/0;redis://b:2/0", "redis://a:1/0"),
        ("amqp://guest@rabbit//", DEFAULT_URL),
        ("memory://", DEFAULT_URL),
        (None, DEFAULT_URL),
    ],
)
def test_url_defaults_to_a_redis_broker(broker: str | None, expected: str) -> None:
    assert from_conf({"broker_url": broker}).url == expected


def test_explicit_url_wins_over_the_broker() -> None:
    conf = {"broker_url": "redis://broker:6379/1", "redislock_url": "redis://locks:6379/0"}
    assert from_conf(conf).url == "redis://locks:6379/0"


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
