"""The shims' own checks, no worker: bad options at class creation, the lock
store they follow, and their exceptions."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from celery import Celery

from celery_redislock import AlreadyQueued as LibraryAlreadyQueued
from celery_redislock import ConfigurationError, config
from celery_redislock.compat import AlreadyQueued, DuplicateTaskError, QueueOnce, Singleton


def app_of(**conf: Any) -> Celery:
    app = Celery("shims", broker="redis://127.0.0.1:1/1", set_as_current=False)
    app.conf.update(broker_connection_retry_on_startup=True, **conf)
    return app


def test_bad_once_options_are_refused_at_class_creation() -> None:
    app = app_of()
    with pytest.raises(ConfigurationError, match=r"task 'bad': option once has unknown key"):

        @app.task(name="bad", base=QueueOnce, shared=False, once={"key": ["a"]})
        def bad(a: int) -> None: ...

        bad.name  # noqa: B018  (the class is made as the app finalizes)
    with pytest.raises(ConfigurationError, match=r"timeout'\]=-1 must be a positive"):

        @app.task(name="bad2", base=QueueOnce, shared=False, once={"timeout": -1})
        def bad2(a: int) -> None: ...

        bad2.name  # noqa: B018


def test_a_key_naming_no_parameter_is_refused() -> None:
    app = app_of()
    with pytest.raises(ConfigurationError, match="names parameter 'b'"):

        @app.task(name="nokey", base=Singleton, shared=False, unique_on=["b"])
        def nokey(a: int) -> None: ...

        nokey.name  # noqa: B018


def test_a_bad_per_call_once_option_is_refused() -> None:
    app = app_of(ONCE={"backend": "celery_once.backends.Redis", "settings": {}})

    @app.task(name="t", base=QueueOnce, shared=False)
    def t(a: int) -> None: ...

    with pytest.raises(ConfigurationError, match="per call takes"):
        t.apply_async((1,), once={"keys": ["a"]})


def test_the_store_follows_the_peers_settings() -> None:
    once = app_of(
        ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": "redis://h1:1/4"}}
    )
    single = app_of(result_backend="redis://h2:2/5")
    own = app_of(singleton_backend_url="redis://h3:3/6", redislock_url="redis://h4:4/7")
    for app, base, url in (
        (once, QueueOnce, "redis://h1:1/4"),
        (single, Singleton, "redis://h2:2/5"),
        (own, Singleton, "redis://h4:4/7"),  # redislock_url wins
    ):

        @app.task(name="t", base=base, shared=False)
        def t(a: int) -> None: ...

        app.finalize()
        assert config.settings_for(app).url == url
        config.reset(app)


def test_two_stores_in_one_app_are_refused() -> None:
    app = app_of(
        ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": "redis://h1:1/4"}},
        singleton_backend_url="redis://h2:2/5",
    )

    @app.task(name="a", base=QueueOnce, shared=False)
    def a(x: int) -> None: ...

    @app.task(name="b", base=Singleton, shared=False)
    def b(x: int) -> None: ...

    with pytest.raises(ConfigurationError, match="name two lock stores"):
        app.finalize()


@pytest.mark.parametrize(
    ("conf", "base"),
    [
        ({"ONCE": {"backend": "celery_once.backends.File", "settings": {}}}, QueueOnce),
        ({"singleton_backend_class": "proj.backends.Mine"}, Singleton),
    ],
)
def test_a_backend_other_than_redis_is_refused(conf: dict[str, Any], base: Any) -> None:
    app = app_of(**conf)

    @app.task(name="t", base=base, shared=False)
    def t(a: int) -> None: ...

    with pytest.raises(ConfigurationError, match="keeps its keys in a Redis lock store"):
        app.finalize()


def test_the_exceptions_are_the_peers_and_the_librarys() -> None:
    once = AlreadyQueued(1.5, "k", "id1", 1500)
    assert (once.countdown, once.message, once.task_id) == (1.5, "Expires in 1.5 seconds", "id1")
    single = DuplicateTaskError("Attempted to queue a duplicate of task ID id2", "id2", "k")
    assert single.task_id == "id2"
    for exc in (once, single):
        assert isinstance(exc, LibraryAlreadyQueued)
        copy = pickle.loads(pickle.dumps(exc))
        assert (type(copy), copy.args, copy.task_id) == (type(exc), exc.args, exc.task_id)
