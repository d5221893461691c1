"""Beat-scheduled runs of a LockedTask take the lock like any other dispatch, and
a unique job that beat fires faster than it runs is queued once at a time."""

from __future__ import annotations

import os
import re
import tempfile
import time

import pytest
import redis

from tests.helpers import assert_no_overlap
from tests.integration.task_helpers import runs, uniq
from tests.workers import Worker


def run_beat(redis_base: str, tag: str) -> str:
    """Run a worker with beat for 3 s: beat fires every 0.2 s, each run takes 0.5 s."""
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
        time.sleep(3.0)
    finally:
        worker.stop()
    return worker.output()


@pytest.fixture(scope="module")
def beat_run(redis_base: str) -> tuple[str, str]:
    tag = uniq("beat")
    return tag, run_beat(redis_base, tag)


@pytest.mark.worker
@pytest.mark.slow
def test_beat_schedule_faster_than_the_task_never_overlaps(
    beat_run: tuple[str, str], rec: redis.Redis
) -> None:
    tag, log = beat_run
    records = runs(rec, tag)
    skipped = log.count("lock 'b.scheduled' is held by task")
    # Scheduled runs happened, never two at once, and the extra ticks were
    # visibly skipped rather than run alongside.
    assert len(records) >= 3, log[-2000:]
    assert_no_overlap(records)
    assert skipped >= len(records), log[-2000:]


@pytest.mark.worker
@pytest.mark.slow
def test_beat_queues_a_unique_job_once_at_a_time(
    beat_run: tuple[str, str], rec: redis.Redis
) -> None:
    """b.configured is ``unique="until_finished"`` in redislock_tasks: while one
    runs or waits, beat's ticks are duplicates, sent nowhere; so every message
    the worker got ran, none was skipped, and none overlapped."""
    tag, log = beat_run
    records = runs(rec, f"{tag}-unique")
    received = len(re.findall(r"Task b\.configured\[[^]]+\] received", log))
    assert len(records) >= 3, log[-2000:]
    assert_no_overlap(records)
    assert "lock 'b.configured' is held by task" not in log
    # Each message received ran (the one received as the worker stopped may not have).
    assert len({r["id"] for r in records}) == len(records)
    assert 0 <= received - len(records) <= 1, log[-3000:]
    assert "duplicate of task" in log  # beat's extra ticks, refused as it sent them
