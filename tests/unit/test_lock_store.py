"""The lock store's forms: which client each URL builds, its errors, its description.

redis-py builds these clients without connecting (bar RedisCluster, tested on a
real cluster in tests/integration/test_store_forms.py), so what they were built
with is read back from their pools.
"""

from __future__ import annotations

import ssl
from typing import Any

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

from celery_redislock import client_factory, config, lock_store
from celery_redislock.config import from_conf, store
from celery_redislock.exceptions import ConfigurationError

SENTINELS = "sentinel://:pw@s1:26379/3;sentinel://s2:26380;sentinel://s3"


def make_client() -> redis.Redis:
    return redis.Redis(port=1, db=5)


def not_a_client() -> str:
    return "redis://localhost"


def kwargs_of(client: Any) -> dict[str, Any]:
    return dict(client.connection_pool.connection_kwargs)


def test_a_redis_url_gets_the_timeouts_and_the_health_check() -> None:
    client = lock_store.connect("redis://h:6390/2", socket_timeout=3.0)
    kw = kwargs_of(client)
    assert (kw["host"], kw["port"], kw["db"]) == ("h", 6390, 2)
    assert (kw["socket_timeout"], kw["socket_connect_timeout"]) == (3.0, 3.0)
    assert kw["health_check_interval"] == 30
    assert kwargs_of(lock_store.connect("redis://h", socket_timeout=9.0))[
        "socket_connect_timeout"
    ] == pytest.approx(5.0)


def test_redis_socket_is_a_unix_socket() -> None:
    client = lock_store.connect("redis+socket:///run/r.sock?db=4")
    kw = kwargs_of(client)
    assert (kw["path"], kw["db"]) == ("/run/r.sock", 4)
    assert client.connection_pool.connection_class is redis.UnixDomainSocketConnection


@pytest.mark.parametrize(
    ("reqs", "expected"),
    [
        ("required", ssl.CERT_REQUIRED),
        ("CERT_OPTIONAL", ssl.CERT_OPTIONAL),
        ("none", ssl.CERT_NONE),
        (ssl.CERT_REQUIRED, ssl.CERT_REQUIRED),
        (0, ssl.CERT_NONE),
    ],
)
def test_ssl_options_turn_tls_on_with_any_spelling_of_cert_reqs(reqs: Any, expected: Any) -> None:
    options = {"ssl_cert_reqs": reqs, "ssl_ca_certs": "/ca.pem"}
    for url in ("rediss://h:6380/0", "redis://h:6380/0"):  # redis:// too, as Celery does
        client = lock_store.connect(url, ssl=options)
        kw = kwargs_of(client)
        assert client.connection_pool.connection_class is redis.SSLConnection
        assert kw["ssl_cert_reqs"] == expected and kw["ssl_ca_certs"] == "/ca.pem"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ssl_cert_reqs": "maybe"}, r"redislock_ssl\['ssl_cert_reqs'\] must be 'required'"),
        ({"cert_reqs": "none"}, "takes ssl_\\* keys"),
        ("yes", "must be a dict"),
    ],
)
def test_bad_ssl_options_name_the_setting(options: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        from_conf({"redislock_url": "rediss://h", "redislock_ssl": options})


def test_ssl_on_a_unix_socket_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="unix socket"):
        lock_store.connect("unix:///r.sock", ssl={"ssl_cert_reqs": "none"})


def test_a_sentinel_url_asks_for_the_master_with_the_first_urls_credentials() -> None:
    client = lock_store.connect(
        SENTINELS,
        options={
            "master_name": "mymaster",
            "sentinel_kwargs": {"password": "sentinel-pw"},
            "min_other_sentinels": 1,
            "socket_keepalive": True,
        },
        socket_timeout=2.0,
    )
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    kw = pool.connection_kwargs
    assert (kw["password"], kw["db"], kw["socket_timeout"], kw["socket_keepalive"]) == (
        "pw",
        3,
        2.0,
        True,
    )
    manager = pool.sentinel_manager
    assert manager.min_other_sentinels == 1
    addresses = [s.connection_pool.connection_kwargs for s in manager.sentinels]
    assert [(a["host"], a["port"]) for a in addresses] == [
        ("s1", 26379),
        ("s2", 26380),
        ("s3", 26379),
    ]
    # The sentinels get their own password, and the lock client's timeouts.
    assert {a["password"] for a in addresses} == {"sentinel-pw"}
    assert {a["socket_timeout"] for a in addresses} == {2.0}
    # A list is the same as the ';'-separated string.
    listed = lock_store.connect(SENTINELS.split(";"), options={"master_name": "mymaster"})
    assert listed.connection_pool.connection_kwargs["db"] == 3


def test_a_sentinel_url_without_master_name_names_the_setting_to_set() -> None:
    with pytest.raises(ConfigurationError, match=r"redislock_transport_options = \{'master_name'"):
        lock_store.connect(SENTINELS, options={})
    conf = {"broker_url": SENTINELS, "broker_transport_options": {"visibility_timeout": 60}}
    with pytest.raises(ConfigurationError, match=r"broker_transport_options = \{'master_name'"):
        config._connect(conf, from_conf(conf))


def test_an_unknown_transport_option_is_named() -> None:
    with pytest.raises(ConfigurationError, match=r"redislock_transport_options\['visibility"):
        lock_store.connect("redis://h", options={"visibility_timeout": 5})
    with pytest.raises(ConfigurationError, match=r"\['master_name'\] is for a sentinel://"):
        lock_store.connect("redis://h", options={"master_name": "m"})


def test_a_sentinel_broker_is_followed_with_its_master_name() -> None:
    conf = {
        "broker_url": SENTINELS,
        "broker_transport_options": {"master_name": "brokers", "visibility_timeout": 60},
        "redislock_lock_retry_backoff_max": 30.0,
    }
    assert store(conf) == (SENTINELS, "broker_url")
    settings = from_conf(conf)
    # Only Sentinel's own options come along, not kombu's.
    assert settings.transport_options == {"master_name": "brokers"}
    assert config._connect(conf, settings).connection_pool.service_name == "brokers"
    assert (
        config.describe_store(settings)
        == "sentinel://s1:26379,s2:26380,s3:26379 (master brokers, db 3)"
    )
    # The broker's visibility timeout counts for a Sentinel broker too.
    with pytest.raises(ConfigurationError, match="visibility_timeout"):
        from_conf({**conf, "redislock_lock_retry_backoff_max": 60.0})
    # redislock_transport_options beats the broker's.
    own = from_conf({**conf, "redislock_transport_options": {"master_name": "locks"}})
    assert own.transport_options == {"master_name": "locks"}


def test_a_sentinel_result_backend_is_followed_with_its_own_options() -> None:
    conf = {
        "broker_url": "amqp://guest@rabbit//",
        "result_backend": SENTINELS.split(";"),
        "result_backend_transport_options": {"master_name": "results"},
        "broker_transport_options": {"master_name": "not-this-one"},
    }
    assert store(conf) == (SENTINELS, "result_backend")
    assert from_conf(conf).transport_options == {"master_name": "results"}


def test_a_followed_brokers_tls_options_come_along() -> None:
    conf = {
        "broker_url": "rediss://b:6380/0",
        "broker_use_ssl": {"ssl_cert_reqs": ssl.CERT_NONE},
    }
    settings = from_conf(conf)
    assert settings.ssl == {"ssl_cert_reqs": ssl.CERT_NONE}
    assert kwargs_of(config._connect(conf, settings))["ssl_cert_reqs"] == ssl.CERT_NONE


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://h:7000,h:x", "each node of a Redis Cluster URL is host:port"),
        ("redis+cluster://h:7000/3", "only its nodes"),
        ("redis://a:1;redis://b:2", "only sentinel:// URLs come in a list"),
        ("sentinel://a:1;redis://b:2", "mixes sentinel:// URLs"),
        ("memcached://m:11211", "must be a URL of one of"),
    ],
)
def test_bad_urls_are_named(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        lock_store.connect(url, options={"master_name": "m"} if "sentinel" in url else {})
    assert "redislock_url" in str(info.value)


@pytest.mark.parametrize(
    ("url", "options", "shown"),
    [
        ("redis://:s3cret@h:6380/4", None, "redis://h:6380/4"),
        ("unix:///tmp/r.sock?db=3", None, "unix:///tmp/r.sock/3"),
        ("redis+socket:///tmp/r.sock", None, "redis+socket:///tmp/r.sock/0"),
        (SENTINELS, {"master_name": "mymaster"},
         "sentinel://s1:26379,s2:26380,s3:26379 (master mymaster, db 3)"),
        ("sentinel://u:s3cret@s1", None, "sentinel://u@s1:26379 (master ?, db 0)"),
        ("rediss+cluster://u:s3cret@h1:7000,h2:7001", None, "rediss+cluster://u@h1:7000,h2:7001"),
    ],
)  # fmt: skip
def test_every_form_is_described_without_its_password(url: str, options: Any, shown: str) -> None:
    assert lock_store.describe(url, options) == shown


def test_a_client_factory_is_called_and_checked() -> None:
    client = client_factory.from_factory(f"{__name__}:make_client")
    assert kwargs_of(client)["db"] == 5
    assert kwargs_of(client_factory.from_factory(f"{__name__}.make_client"))["db"] == 5
    assert kwargs_of(client_factory.from_factory(make_client))["db"] == 5
    with pytest.raises(
        ConfigurationError, match=r"redislock_client \(.*not_a_client\) returned str"
    ):
        client_factory.from_factory(not_a_client)
    with pytest.raises(ConfigurationError, match=r"redislock_client: cannot import 'nope\.mod:f'"):
        client_factory.from_factory("nope.mod:f")
    with pytest.raises(ConfigurationError, match="CELERY_REDISLOCK_CLIENT"):
        client_factory.from_factory(f"{__name__}:SENTINELS", "CELERY_REDISLOCK_CLIENT")
    assert lock_store.describe(None, None, f"{__name__}:make_client") == (
        f"the client of {__name__}:make_client"
    )


def test_a_client_factory_beats_the_url_and_the_broker() -> None:
    conf = {"broker_url": "redis://b/1", "redislock_client": make_client}
    settings = from_conf(conf)
    assert settings.url is None
    assert store(conf) == (None, "redislock_client")
    assert kwargs_of(config._connect(conf, settings))["db"] == 5
    assert config.describe_store(settings) == f"the client of {__name__}:make_client"
