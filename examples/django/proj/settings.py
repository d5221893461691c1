"""Settings of the example project: Django's few, then Celery's under ``CELERY_``.

``REDIS_URL`` is the broker and the result backend; ``REDISLOCK_URL`` (by default
the same) is the lock store.  ``METRICS_PORT`` switches the workers' Prometheus
endpoint on (docker/compose.yaml sets it).
"""

import os

from celery_redislock import ConfiguredLocks

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["accounts"]
ROOT_URLCONF = "proj.urls"
DATABASES: dict = {}  # the tasks need none
USE_TZ = True

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_REDISLOCK_URL = os.environ.get("REDISLOCK_URL", REDIS_URL)

# accounts.tasks.sync_account is locked in its code (base=LockedTask); the
# rebuild_* tasks are plain Celery, locked from here alone.
CELERY_TASK_ANNOTATIONS = [ConfiguredLocks()]
CELERY_REDISLOCK_TASKS = {
    "accounts.tasks.rebuild_*": {"lock_key": ["account_id"], "on_contention": "park"},
}

# Prometheus metrics of the locked runs, when METRICS_PORT is set (0: off); a
# prefork worker then needs PROMETHEUS_MULTIPROC_DIR (see docker/compose.yaml).
CELERY_REDISLOCK_METRICS_PORT = int(os.environ.get("METRICS_PORT", "0"))

CELERY_BEAT_SCHEDULE = {
    "rebuild-statement-of-account-1": {
        "task": "accounts.tasks.rebuild_statement",
        "schedule": 30.0,
        "args": (1,),
    },
}
