"""A Celery app whose lock store is configured by the test that starts its worker.

``REDISLOCK_TEST_STORE_CONF`` (JSON) is put into ``app.conf``: the broker, the
result backend and the ``redislock_*`` settings of one form of lock store
(tests/integration/test_store_forms.py, test_store_acl.py).  Bodies record on
db 3 of ``REDISLOCK_TEST_REDIS`` (tests.celery_app's ``body``), whatever the
store.  Tasks go to their own queue, so a worker of this app takes nothing of
another module's.  The test process builds the same app with :func:`make_app`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery

from celery_redislock import LockedTask
from tests.celery_app import body, recorder

QUEUE = "store-forms"


def make_app(conf: dict[str, Any], main: str = "store_forms") -> Celery:
    app = Celery(main, set_as_current=False)
    app.conf.update(
        redislock_lock_retry_backoff=0.05,
        redislock_lock_retry_backoff_max=0.4,
        redislock_lock_ttl=5.0,
        redislock_park_reserve=2.0,
        redislock_park_sweep_interval=0.5,
        task_default_queue=QUEUE,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        result_expires=600,
        broker_connection_retry_on_startup=True,
    )
    app.conf.update(conf)

    def task(name: str, **options: Any) -> None:
        def locked(self: Any, job: str, tag: str, duration: float = 0.3, seq: int = 0) -> Any:
            return body(self, tag, duration, job=job, seq=seq)

        locked.__qualname__ = locked.__name__ = name.replace(".", "_")
        app.task(name=name, base=LockedTask, bind=True, shared=False, lock_key=["job"], **options)(
            locked
        )

    task("s.retry", on_contention="retry")
    task("s.park", on_contention="park")
    task("s.unique", unique="until_finished", on_contention="park")
    task("s.sem", semaphore=2, on_contention="wait")
    return app


def make_client() -> redis.Redis:
    """A ``redislock_client`` factory: records each call's pid on db 3."""
    recorder().rpush(os.environ["REDISLOCK_TEST_FACTORY_TAG"], os.getpid())
    return redis.Redis.from_url(os.environ["REDISLOCK_TEST_FACTORY_URL"], socket_timeout=5)


app = make_app(json.loads(os.environ.get("REDISLOCK_TEST_STORE_CONF", "{}")))
