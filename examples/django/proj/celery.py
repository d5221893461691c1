"""The project's Celery app, configured from Django's settings (the ``CELERY_`` names)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# CELERY_BROKER_URL -> broker_url, CELERY_REDISLOCK_TASKS -> redislock_tasks, ...
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
