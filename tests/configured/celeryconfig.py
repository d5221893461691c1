"""The whole of the library's part in this project: two settings.

Broker db 4, results db 5, locks db 6, recordings db 3 of REDISLOCK_TEST_REDIS.
"""

import os

from celery_redislock import ConfiguredLocks

BASE = os.environ.get("REDISLOCK_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")

broker_url = f"{BASE}/4"
result_backend = f"{BASE}/5"
redislock_url = f"{BASE}/6"
redislock_lock_ttl = 5.0
worker_prefetch_multiplier = 1
worker_hijack_root_logger = False
broker_connection_retry_on_startup = True

task_annotations = [ConfiguredLocks()]
redislock_tasks = {
    "cfg.plain.skip": {"lock_key": ["job"], "on_contention": "skip"},
    "cfg.shared.*": {"lock_key": ["job"], "on_contention": "skip"},
    # More specific than "cfg.shared.*": parks instead of skipping.
    "cfg.shared.park*": {"on_contention": "park"},
    "cfg.plain.park": {"lock_key": ["job"], "on_contention": "park"},
    # Code says on_contention="fail": code wins; the key comes from here.
    "cfg.plain.coded": {"lock_key": ["job"], "on_contention": "skip"},
    "cfg.plain.slow": {"lock_key": ["job"], "on_contention": "fail"},
    "cfg.custom": {"lock_key": ["job"], "on_contention": "skip"},
    "cfg.nothing.*": {"on_contention": "skip"},  # matches no task: a warning
    # A unique job, sent by name as well as through the task.
    "cfg.unique": {"lock_key": ["job"], "unique": "until_finished", "on_contention": "skip"},
}
