"""The demo app's settings, from one Redis URL.

One Redis serves as broker, result backend and lock store, each on its own db
(the URL's db, then the next two), so the demo's keys never mix with Celery's;
its queue and key prefix are the demo's own too, so a shared Redis is safe.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: The environment variable the worker and the demo both read.
URL_ENV = "REDIS_URL"
DEFAULT_URL = "redis://127.0.0.1:6379/0"
QUEUE = "redislock-demo"
KEY_PREFIX = "redislock-demo"


def with_db(url: str, offset: int) -> str:
    """``url`` on its own db plus ``offset`` (``redis://h:6379/3``, 1 -> ``/4``)."""
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{db + offset}"))


def lock_url() -> str:
    """Where the locks, and the demo's own records, live."""
    return with_db(os.environ.get(URL_ENV, DEFAULT_URL), 2)


def settings() -> dict[str, Any]:
    url = os.environ.get(URL_ENV, DEFAULT_URL)
    return {
        "broker_url": with_db(url, 0),
        "result_backend": with_db(url, 1),
        "redislock_url": lock_url(),
        "redislock_key_prefix": KEY_PREFIX,
        "task_default_queue": QUEUE,
        # Contention retries come back after 0.2-1 s, so the demo runs in
        # seconds (the defaults, 1 s doubling up to 30 s, suit production).
        "redislock_lock_retry_backoff": 0.2,
        "redislock_lock_retry_backoff_max": 1.0,
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
        "result_expires": 3600,
    }
