"""LockedTask leaves Celery's result store to Celery, whatever the result settings.

The lock is released by a round trip of its own, never inside the result store, so
a worker stores results exactly as Celery does: compressed or not, in any result
serializer, for locked and plain tasks alike, and a SUCCESS already stored is never
overwritten by a later run with the same task id (Celery's own rule).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery, states
from celery.backends import base as celery_backends

from tests.helpers import wait_until
from tests.integration.task_helpers import lock_key, postruns, runs, start_worker, uniq

pytestmark = [pytest.mark.worker, pytest.mark.slow]

RESULT_CONFS: dict[str, dict[str, Any]] = {
    "zlib": {"result_compression": "zlib"},
    # Results in pickle; task messages stay JSON (a root worker refuses pickled ones).
    "pickle": {"result_serializer": "pickle", "result_accept_content": ["json", "pickle"]},
}


def stored_prefix(conf: str) -> bytes:
    """How a stored result starts under ``conf`` (proof that the setting was in force)."""
    if conf == "zlib":
        # Celery 5.7 compresses results, marked in-band; earlier releases store them as is.
        return getattr(celery_backends, "COMPRESSED_PAYLOAD_MAGIC", b"{")
    return b"\x80"  # a pickle


@pytest.fixture(params=list(RESULT_CONFS))
def setup(
    request: pytest.FixtureRequest, redis_base: str, capp: ModuleType
) -> Iterator[tuple[str, Celery]]:
    """A worker storing results under one configuration, and an app reading them the same way."""
    conf = request.param
    worker = start_worker(
        redis_base,
        f"results-{conf}",
        concurrency=2,
        env={"REDISLOCK_TEST_RESULT_CONF": json.dumps(RESULT_CONFS[conf])},
    )
    reader = Celery("results-reader", broker=f"{redis_base}/1", backend=f"{redis_base}/2")
    reader.conf.update(RESULT_CONFS[conf])
    try:
        yield conf, reader
    finally:
        reader.backend.client.connection_pool.disconnect()
        reader.close()
        worker.stop()


def stored(reader: Celery, task_id: str) -> dict[str, Any]:
    """The result as stored now, decoded as Celery decodes it (no cache)."""
    return reader.backend.get_task_meta(task_id, cache=False)


def wait_stored(reader: Celery, task_id: str) -> dict[str, Any]:
    """The result once the run has ended (polled: no result consumer to leave open)."""
    return wait_until(
        lambda: m if (m := stored(reader, task_id))["status"] in states.READY_STATES else None,
        timeout=20,
        what=f"the result of {task_id}",
    )


def test_results_are_stored_as_celery_stores_them(
    setup: tuple[str, Celery],
    capp: ModuleType,
    rec: redis.Redis,
    locks: redis.Redis,
    redis_base: str,
    request: pytest.FixtureRequest,
) -> None:
    conf, reader = setup
    tag, failing, cb = uniq("res"), uniq("res-raise"), uniq("res-plain")
    # A locked run's SUCCESS, a locked run's FAILURE and a plain task's SUCCESS, from
    # one worker: every kind of store a LockedTask run used to touch.
    # Sent by an app without a result backend: an app that sends a task with one
    # subscribes to its result's channel, and the session's app would later read
    # these results' messages, in another serializer, from its pub/sub connection.
    sender = Celery("results-sender", broker=f"{redis_base}/1")
    request.addfinalizer(sender.close)
    first = sender.send_task(capp.lt_outcome.name, (tag, "success"))
    failed = sender.send_task(capp.lt_outcome.name, (failing, "raise"))
    plain = sender.send_task(capp.lt_rec.name, (1, "two"), {"tag": cb, "label": "plain"})
    meta = wait_stored(reader, first.id)
    value = meta["result"]
    assert meta["status"] == "SUCCESS", meta
    assert value["id"] == first.id and value["fence"] is not None
    meta = wait_stored(reader, failed.id)
    assert meta["status"] == "FAILURE", meta
    assert isinstance(meta["result"], ValueError) and str(meta["result"]) == f"boom {failing}"
    assert wait_stored(reader, plain.id)["result"] == [1, "two"]

    results = redis.Redis.from_url(f"{redis_base}/2")
    try:
        for task_id in (first.id, failed.id, plain.id):
            raw = results.get(f"celery-task-meta-{task_id}")
            assert raw is not None and raw.startswith(stored_prefix(conf)), (conf, raw[:40])
    finally:
        results.close()

    # The same task id runs again and fails: its SUCCESS stays as it was stored.
    sender.send_task(capp.lt_outcome.name, (tag, "raise"), task_id=first.id)
    posts = postruns(rec, first.id, 2, timeout=20)
    assert [p["state"] for p in posts] == ["SUCCESS", "FAILURE"]
    assert len(runs(rec, tag)) == 2
    meta = stored(reader, first.id)
    assert meta["status"] == "SUCCESS", meta
    assert meta["result"] == value
    for task_id, state in ((failed.id, "FAILURE"), (plain.id, "SUCCESS")):
        assert stored(reader, task_id)["status"] == state
    assert not locks.exists(lock_key(capp.lt_outcome, (tag, "success")))
    assert not locks.exists(lock_key(capp.lt_outcome, (failing, "raise")))
