"""Celery settings of a project whose tasks are locked from here alone.

The task modules (billing.py, reports.py) never mention celery_redislock.
"""

import os

from celery_redislock import ConfiguredLocks

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

broker_url = REDIS_URL
result_backend = REDIS_URL
# The lock store: the broker here (it is Redis); set redislock_url to use another.

task_annotations = [ConfiguredLocks()]
redislock_tasks = {
    # One charge per customer at a time; the others queue in order.
    "billing.charge": {"lock_key": ["customer_id"], "on_contention": "park"},
    # One rebuild of each report at a time; a duplicate is skipped, visibly.
    "reports.*": {"lock_key": ["report"], "on_contention": "skip", "lock_ttl": 120},
}
