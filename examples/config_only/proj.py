"""The project's Celery app: unchanged by adopting the library."""

from celery import Celery

app = Celery("proj", include=["billing", "reports"])
app.config_from_object("celeryconfig")
