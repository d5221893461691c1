"""The example project; its Celery app loads with Django (``celery -A proj``)."""

from .celery import app as celery_app

__all__ = ["celery_app"]
