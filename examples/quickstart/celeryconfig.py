"""Celery settings of the quickstart: everything on the Redis at REDIS_URL.

One Redis serves as broker, result backend and lock store; their keys do not
overlap (``celery``, ``celery-task-meta-*``, ``redislock:*``).
"""

import os

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")

broker_url = REDIS_URL
result_backend = REDIS_URL
redislock_url = REDIS_URL

# Contention retries come back after 0.2-1 s here, so the demo runs in seconds
# (the defaults, 1 s doubling up to 30 s, suit production).
redislock_lock_retry_backoff = 0.2
redislock_lock_retry_backoff_max = 1.0

worker_prefetch_multiplier = 1
broker_connection_retry_on_startup = True
result_expires = 3600
