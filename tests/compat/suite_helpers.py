"""Apps for the ported suites: a fresh Celery app per test, no worker.

Broker on db 5 (nobody consumes it), results on db 6, and the peers' store
on db 4, flushed per test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis
from celery import Celery

from celery_redislock import config

__all__ = ["make_app"]


@pytest.fixture
def make_app(redis_base: str, store: redis.Redis) -> Iterator[Callable[..., Celery]]:
    """``make_app(**conf)``: an app whose ONCE and singleton settings name db 4."""
    made: list[Celery] = []
    store.flushdb()
    redis.Redis.from_url(f"{redis_base}/5").flushdb()

    def make(**conf: Any) -> Celery:
        app = Celery(f"suite{len(made)}", broker=f"{redis_base}/5", backend=f"{redis_base}/6")
        settings = {
            "ONCE": {
                "backend": "celery_once.backends.Redis",
                "settings": {"url": f"{redis_base}/4", "default_timeout": 60},
            },
            "singleton_backend_url": f"{redis_base}/4",
            "broker_connection_retry_on_startup": True,
        }
        settings.update(conf)
        app.conf.update({k: v for k, v in settings.items() if v is not None})
        made.append(app)
        return app

    yield make
    for app in made:
        config.reset(app)
        app.close()
