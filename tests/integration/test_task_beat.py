"""Beat-scheduled runs of a LockedTask take the lock like any other dispatch."""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import redis

from tests.helpers import assert_no_overlap
from tests.integration.task_helpers import runs, uniq
from tests.workers import Worker


@pytest.mark.worker
@pytest.mark.slow
def test_beat_schedule_faster_than_the_task_never_overlaps(
    redis_base: str, rec: redis.Redis
) -> None:
    tag = uniq("beat")
    schedule = os.path.join(tempfile.mkdtemp(prefix="redislock-beat-"), "schedule")
    worker = Worker(
        redis_base,
        app="tests.beat_app",
        name="beat",
        concurrency=4,
        extra=["-B", "-s", schedule],
        env={"REDISLOCK_TEST_BEAT_TAG": tag},
    ).wait_ready()
    try:
        time.sleep(3.0)  # beat fires every 0.2 s; each run takes 0.5 s
    finally:
        worker.stop()
    records = runs(rec, tag)
    log = worker.output()
    skipped = log.count("lock 'b.scheduled' is held by task")
    # Scheduled runs happened, never two at once, and the extra ticks were
    # visibly skipped rather than run alongside.
    assert len(records) >= 3, log[-2000:]
    assert_no_overlap(records)
    assert skipped >= len(records), log[-2000:]
