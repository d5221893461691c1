"""Another existing task module: plain Celery."""

import time

from celery import shared_task


@shared_task(name="reports.rebuild")
def rebuild(report: str) -> str:
    time.sleep(1.0)
    return f"rebuilt {report}"
