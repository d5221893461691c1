"""The Celery side: the app and the per-user job (``celery -A jobs worker``).

``sync_user`` is a unique job: while a user's job waits in the queue or runs,
publishing it again sends nothing (``unique="until_finished"``); with
``on_duplicate="raise"`` the publisher learns the id of the job already there.
"""

import os
import time

import redis
from celery import Celery

from celery_redislock import LockedTask

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("jobs", broker=REDIS_URL, backend=REDIS_URL)
# The lock store is the broker (it is Redis); set redislock_url to use another.


@app.task(
    base=LockedTask,
    name="jobs.sync_user",
    lock_key=["user_id"],
    unique="until_finished",
    on_duplicate="raise",
)
def sync_user(user_id: int, seconds: float = 1.0) -> int:
    """Sync one user (a slow call to a partner's API); returns how many syncs
    of this user have run so far."""
    time.sleep(seconds)
    with redis.Redis.from_url(REDIS_URL) as r:
        return int(r.incr(f"syncs:{user_id}"))
