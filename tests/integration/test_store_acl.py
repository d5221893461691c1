"""The ACL rule docs/deployments.md gives is all a worker and the inspect API need.

A private redis-server gets the user exactly as the docs write it (and
nothing more); a prefork worker of tests/store_app.py uses it as its lock
store, its broker and results elsewhere.  Contended runs retry and park,
a unique job is refused twice, a semaphore keeps its limit, and the inspect
API lists and frees a held lock.  Then the server's ACL LOG must show no
refusal beyond what may be refused (CONFIG GET of the start-up check, INFO
of the park sweeps, redis-py's CLIENT SETINFO), and the user must be refused
what the rule leaves out.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_redislock.inspect import Inspector
from tests.helpers import intervals, peak_overlap, wait_until
from tests.integration.task_helpers import collect, runs, uniq
from tests.integration.test_store_forms import contend, logged_store, store_worker, unique_once
from tests.redis_server import RedisServer
from tests.workers import ROOT, Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

PASSWORD = "acl-pw-7d1e"
#: What the worker may be refused: the start-up check's CONFIG GET and the
#: park sweeps' INFO (the docs grant them apart), redis-py's CLIENT SETINFO.
MAY_BE_REFUSED = {"config|get", "info", "client|setinfo"}


def documented_rule() -> list[str]:
    """The ``ACL SETUSER`` line of docs/deployments.md, as arguments, its password ours."""
    text = (ROOT / "docs" / "deployments.md").read_text()
    (line,) = re.findall(r"^ACL SETUSER locker on .*$", text, flags=re.M)
    args = shlex.split(line)
    assert args[:4] == ["ACL", "SETUSER", "locker", "on"] and args[4] == ">change-me", line
    args[4] = f">{PASSWORD}"
    return args


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    server = RedisServer(extra=["--save", "", "--appendonly", "no"]).start()
    with redis.Redis(port=server.port) as admin:
        admin.execute_command(*documented_rule())
        admin.acl_log_reset()
    yield server
    server.stop()


def refused(server: RedisServer) -> list[dict[str, Any]]:
    with redis.Redis(port=server.port, decode_responses=True) as admin:
        log: list[dict[str, Any]] = admin.acl_log()
    return log


def test_the_documented_acl_rule_is_all_a_worker_and_the_inspect_api_need(
    acl_server: RedisServer, redis_base: str, rec: redis.Redis, stopped: list[Worker]
) -> None:
    conf = {
        "broker_url": f"{redis_base}/1",
        "result_backend": f"{redis_base}/2",
        "redislock_url": f"redis://locker:{PASSWORD}@127.0.0.1:{acl_server.port}/0",
    }
    worker, app = store_worker(redis_base, stopped, "acl", conf)
    assert f"redis://locker@127.0.0.1:{acl_server.port}/0 (from redislock_url)" in (
        logged_store(worker)
    )
    assert PASSWORD not in worker.output()
    job = uniq("acl")
    contend(app, rec, "s.retry", job)
    contend(app, rec, "s.park", f"{job}-park")
    unique_once(app, rec, f"{job}-unique")

    # A semaphore of 2: four runs, never more than two at once.
    tag = uniq("sem")
    _, errors = collect(
        [app.signature("s.sem", (f"{job}-sem", tag, 0.3, i)).apply_async() for i in range(4)],
        timeout=20,
    )
    assert errors == []
    assert peak_overlap(intervals(runs(rec, tag))) == 2

    # The inspect API lists a held lock, and frees it.
    held = app.signature("s.retry", (f"{job}-held", uniq("held"), 3.0)).apply_async()
    inspector = Inspector.from_app(app)
    (entry,) = wait_until(
        lambda: [e for e in inspector.entries(f"*{job}-held*") if e.holders],
        10,
        what="the inspect API to list the held lock",
    )
    assert entry.holders[0].task_id == held.id
    (released,) = inspector.release(entry.name)
    assert [h.task_id for h in released.freed] == [held.id]
    assert not [e for e in inspector.entries(f"*{job}-held*") if e.holders]
    held.get(timeout=10)
    app.close()

    denied = {f"{e['object']}" for e in refused(acl_server)}
    assert denied <= MAY_BE_REFUSED, refused(acl_server)

    # The user is refused what the rule leaves out: keys outside the prefix,
    # commands outside the list, channels.
    with redis.Redis.from_url(conf["redislock_url"]) as locker:
        with pytest.raises(redis.exceptions.NoPermissionError):
            locker.set("elsewhere:key", 1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            locker.get("celery-task-meta-x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            locker.flushdb()
        with pytest.raises(redis.exceptions.NoPermissionError):
            locker.publish("redislock:channel", "x")
        assert locker.set("redislock:probe", 1)  # and allowed what it holds
        locker.delete("redislock:probe")
