"""Two tasks, locked two ways.

- ``sync_account``: ``base=LockedTask`` in its code, one lock per account,
  duplicates skipped (their result is ``TaskSkipped``).
- ``rebuild_statement``: a plain ``shared_task``, locked by
  ``CELERY_REDISLOCK_TASKS`` in proj/settings.py: duplicates park and run one
  after another.

Each returns when and where it ran, so a caller can see runs overlap or not.
"""

import os
import time

from celery import shared_task

from celery_redislock import LockedTask


def _ran(seconds: float) -> dict:
    start = time.time()
    time.sleep(seconds)  # the work: an API call, a report
    return {"pid": os.getpid(), "start": start, "end": time.time()}


@shared_task(base=LockedTask, lock_key=["account_id"], on_contention="skip")
def sync_account(account_id: int, seconds: float = 1.0) -> dict:
    return _ran(seconds)


@shared_task
def rebuild_statement(account_id: int, seconds: float = 0.3) -> dict:
    return _ran(seconds)
