"""Locking configured by task name (``redislock_tasks``), on a real prefork worker.

The project in tests/configured never mentions the library in its task
modules: its celeryconfig puts ``ConfiguredLocks()`` in ``task_annotations``
and lists the tasks in ``redislock_tasks``.  Broker db 4, results db 5, locks
db 6, recordings db 3.  The tests at the end need no worker: precedence,
ambiguity, misspelt options and bad patterns, checked as an app finalizes.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery, Task, shared_task

from celery_redislock import (
    ConfigurationError,
    ConfiguredLocks,
    LockContended,
    LockedTask,
    TaskSkipped,
)
from celery_redislock import config as lock_config
from celery_redislock.primitives import keys
from celery_redislock.tasks import rate_stage
from tests.helpers import assert_no_overlap, intervals, peak_overlap, wait_until
from tests.integration.task_helpers import collect, runs, start_worker, uniq
from tests.workers import ROOT, Worker

N = 20


@pytest.fixture(scope="module")
def cfg(redis_base: str) -> Iterator[ModuleType]:
    """tests.configured.app as the client side, pointed at the session's Redis."""
    os.environ["REDISLOCK_TEST_REDIS"] = redis_base
    for name in [m for m in sys.modules if m.startswith("tests.configured")]:
        del sys.modules[name]
    module = importlib.import_module("tests.configured.app")
    module.app.set_current()
    for db in (4, 5, 6):
        redis.Redis.from_url(f"{redis_base}/{db}").flushdb()
    yield module
    module.app.close()


@pytest.fixture(scope="module")
def worker(redis_base: str, cfg: ModuleType) -> Iterator[Worker]:
    w = start_worker(
        redis_base, "configured", app="tests.configured.app",
        extra=["--prefetch-multiplier", "10"],
    )  # fmt: skip
    yield w
    w.stop()


@pytest.fixture(scope="module")
def lockdb(redis_base: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(f"{redis_base}/6")
    yield client
    client.close()


def lock_key(task: Any, *args: Any) -> str:
    name = task.lock_name_for(args, {})
    return keys.lock_keys(lock_config.settings_for(task.app).key_prefix, name).lock


# -- on a worker -----------------------------------------------------------------


@pytest.mark.worker
@pytest.mark.parametrize("task_name", ["plain_skip", "shared_skip"])
def test_twenty_duplicates_run_once_and_skip_nineteen(
    worker: Worker, cfg: ModuleType, rec: redis.Redis, task_name: str
) -> None:
    task = getattr(cfg, task_name)
    tag, job = uniq("cfgskip"), uniq("job")
    eta = datetime.now(timezone.utc) + timedelta(seconds=1.0)
    results = [task.apply_async((job, tag, 2.0), eta=eta) for _ in range(N)]
    values, errors = collect(results)
    ran = runs(rec, tag)
    assert len(ran) == 1 and len(values) == 1, (ran, values)
    assert len(errors) == N - 1 and all(isinstance(e, TaskSkipped) for e in errors), errors
    assert {e.holder for e in errors} == {ran[0]["id"]}


@pytest.mark.worker
@pytest.mark.parametrize("task_name", ["plain_park", "shared_park"])
def test_parked_duplicates_all_run_one_at_a_time_in_order(
    worker: Worker, cfg: ModuleType, rec: redis.Redis, lockdb: redis.Redis, task_name: str
) -> None:
    task = getattr(cfg, task_name)
    tag, job = uniq("cfgpark"), uniq("job")
    first = task.apply_async((job, tag, 0, 1.0))
    wait_until(lambda: lockdb.exists(lock_key(task, job, tag, 0, 1.0)), 10, what="a holder")
    results = [first] + [task.apply_async((job, tag, i, 0.1)) for i in range(1, 8)]
    _, errors = collect(results)
    assert errors == []
    ran = sorted(runs(rec, tag), key=lambda r: r["start"])
    assert [r["seq"] for r in ran] == list(range(8))
    assert peak_overlap(intervals(ran)) == 1
    assert all(r["sent"] is not None for r in ran)  # stamped as published


@pytest.mark.worker
def test_options_in_code_win_and_a_custom_base_keeps_its_call_and_request(
    worker: Worker, cfg: ModuleType, rec: redis.Redis, lockdb: redis.Redis
) -> None:
    tag, job = uniq("cfgcoded"), uniq("job")
    first = cfg.plain_coded.delay(job, tag, 1.0)
    key = lock_key(cfg.plain_coded, job, tag)
    wait_until(lambda: lockdb.exists(key), 10, what="the first run to take its lock")
    with pytest.raises(LockContended):  # code says fail; the config says skip
        cfg.plain_coded.delay(job, tag, 0.0).get(timeout=10)
    first.get(timeout=10)

    tag, job = uniq("cfgcustom"), uniq("job")
    eta = datetime.now(timezone.utc) + timedelta(seconds=0.5)
    results = [cfg.custom.apply_async((job, tag, 1.0), eta=eta) for _ in range(3)]
    _, errors = collect(results)
    ran = runs(rec, tag)
    assert len(ran) == 1 and ran[0]["custom"] is True  # the base's own __call__ ran
    assert len(errors) == 2 and all(isinstance(e, TaskSkipped) for e in errors)


@pytest.mark.worker
@pytest.mark.parametrize("how", ["time limit", "revoke"])
def test_a_killed_run_frees_its_lock_within_a_second(
    worker: Worker, cfg: ModuleType, lockdb: redis.Redis, how: str
) -> None:
    tag, job = uniq("cfgkill"), uniq("job")
    key = lock_key(cfg.plain_slow, job, tag)
    options = {"time_limit": 1.0} if how == "time limit" else {}
    result = cfg.plain_slow.apply_async((job, tag, 30.0), **options)
    wait_until(lambda: lockdb.exists(key), 10, 0.005, "the run to take its lock")
    taken = time.monotonic()
    if how == "revoke":
        time.sleep(0.3)
        cfg.app.control.revoke(result.id, terminate=True)
        killed = time.monotonic()
    else:
        killed = taken + 1.0
    wait_until(lambda: not lockdb.exists(key), 5, 0.005, "the lock to be freed")
    freed = time.monotonic()
    assert freed - killed < 1.0, freed - killed
    assert lockdb.pttl(key) == -2


@pytest.mark.worker
def test_the_worker_logs_what_it_locks_and_warns_of_patterns_that_match_nothing(
    worker: Worker,
) -> None:
    out = worker.output()
    locked = [x for x in out.splitlines() if "celery_redislock: locked tasks:" in x]
    assert len(locked) == 1, locked
    assert (
        "cfg.plain.skip (lock_key=['job'], on_contention='skip'; from redislock_tasks" in locked[0]
    )
    assert (
        "cfg.shared.park (on_contention='park'; from redislock_tasks['cfg.shared.park*'])"
        in (locked[0])
    )
    warned = [x for x in out.splitlines() if "matches no registered task" in x]
    assert len(warned) == 1 and "'cfg.nothing.*'" in warned[0] and "WARNING" in warned[0]


CLIENT = """
import json, sys, time
from celery import Celery
client = Celery("configured-client")
client.config_from_object("tests.configured.celeryconfig")
job, tag = sys.argv[1], sys.argv[2]
results = [client.send_task("cfg.plain.park", args=[job, tag, 0, 1.0])]
time.sleep(0.5)  # the first run holds the lock: the others park, in the order sent
results += [client.send_task("cfg.plain.park", args=[job, tag, i, 0.1]) for i in range(1, 6)]
print(json.dumps([r.get(timeout=30) for r in results]))
print(json.dumps(sorted(m for m in sys.modules if m.startswith("tests.configured.app"))))
"""


@pytest.mark.worker
def test_send_task_by_name_from_a_client_with_only_the_config(
    worker: Worker, redis_base: str, rec: redis.Redis
) -> None:
    tag, job = uniq("cfgsend"), uniq("job")
    env = {**os.environ, "REDISLOCK_TEST_REDIS": redis_base, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, job, tag],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    ids, imported = (json.loads(line) for line in out.stdout.splitlines()[-2:])
    assert imported == []  # the client never imported the task module
    ran = sorted(runs(rec, tag), key=lambda r: r["start"])
    assert [r["id"] for r in ran] == ids
    assert [r["seq"] for r in ran] == list(range(6))
    assert_no_overlap(ran)
    assert all(r["sent"] is not None for r in ran)  # stamped by the client as it sent


UNIQUE_CLIENT = """
import json, sys
from celery import Celery
client = Celery("configured-client")
client.config_from_object("tests.configured.celeryconfig")
job, tag = sys.argv[1], sys.argv[2]
sent = [client.send_task("cfg.unique", kwargs={"job": job, "tag": tag, "duration": 1.0})
        for _ in range(5)]
print(json.dumps([r.id for r in sent]))
print(json.dumps(sent[0].get(timeout=30)))
print(json.dumps(sorted(m for m in sys.modules if m.startswith("tests.configured.app"))))
"""


@pytest.mark.worker
def test_send_task_by_name_follows_the_unique_options_of_the_config(
    worker: Worker, cfg: ModuleType, redis_base: str, rec: redis.Redis
) -> None:
    # In a process that has the task.
    tag, job = uniq("cfguniq"), uniq("job")
    sent = [cfg.app.send_task("cfg.unique", args=[job, tag, 0.5]) for _ in range(5)]
    assert len({r.id for r in sent}) == 1
    assert sent[0].get(timeout=10) == sent[0].id
    assert [r["id"] for r in runs(rec, tag)] == [sent[0].id]
    # In a client with only the configuration: its first send loads the
    # configuration (past the send_task check, caught as it publishes), the
    # others are duplicates of it.
    tag, job = uniq("cfguniq"), uniq("job")
    env = {**os.environ, "REDISLOCK_TEST_REDIS": redis_base, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", UNIQUE_CLIENT, job, tag],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    ids, value, imported = (json.loads(line) for line in out.stdout.splitlines()[-3:])
    assert len(set(ids)) == 1 and value == ids[0], ids
    assert imported == []
    assert [r["id"] for r in runs(rec, tag)] == [ids[0]]


# -- as an app finalizes -----------------------------------------------------------


def app_with(redis_url: str, tasks: Any, **conf: Any) -> Celery:
    app = Celery("configured-unit", set_as_current=False)
    app.conf.update(
        redislock_url=redis_url,
        task_annotations=[ConfiguredLocks()],
        redislock_tasks=tasks,
        **conf,
    )
    return app


def define(app: Celery, name: str, **options: Any) -> Any:
    def body(user_id: int, region: str = "eu") -> str:
        return "ran"

    return app.task(name=name, shared=False, **options)(body)


def test_an_exact_name_beats_a_glob_and_a_longer_glob_a_shorter_one(redis_url: str) -> None:
    app = app_with(
        redis_url,
        {
            "proj.*": {"on_contention": "retry"},
            "proj.sync.*": {"on_contention": "wait"},
            "proj.sync.user": {"on_contention": "skip", "lock_key": ["user_id"]},
        },
    )
    user, other, report = (
        define(app, "proj.sync.user"),
        define(app, "proj.sync.other"),
        define(app, "proj.report"),
    )
    app.finalize()
    assert [t.on_contention for t in (user, other, report)] == ["skip", "wait", "retry"]
    assert all(isinstance(t, LockedTask) for t in (user, other, report))
    assert user.lock_name_for((7,), {}) == "proj.sync.user:[7]"
    app.close()


def test_two_equally_specific_globs_are_refused_naming_both(redis_url: str) -> None:
    app = app_with(redis_url, {"proj.a*": {}, "proj.*b": {}})
    define(app, "proj.ab")
    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    assert "'proj.a*'" in str(info.value) and "'proj.*b'" in str(info.value)
    assert "'proj.ab'" in str(info.value)
    app.close()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"on_contension": "skip"}, ["'proj.*'", "on_contension", "'on_contention'"]),
        ({"lock_keys": ["user_id"]}, ["'proj.*'", "lock_keys", "'lock_key'"]),
        ({"lock_ttl": -1}, ["'proj.*'", "lock_ttl", "-1"]),
        ({"lock_key": ["nope"]}, ["'proj.*'", "'proj.sync'", "nope"]),
    ],
)
def test_a_bad_option_in_a_pattern_names_the_pattern_and_the_option(
    redis_url: str, options: dict[str, Any], words: list[str]
) -> None:
    app = app_with(redis_url, {"proj.*": options})
    define(app, "proj.sync")
    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    app.close()


def test_a_namespaced_app_is_told_its_own_spelling(redis_url: str) -> None:
    class Settings:
        CELERY_REDISLOCK_URL = redis_url
        CELERY_TASK_ANNOTATIONS = [ConfiguredLocks()]
        CELERY_REDISLOCK_TASKS = {"proj.*": {"on_contention": "sometimes"}}

    app = Celery("configured-ns", set_as_current=False)
    app.config_from_object(Settings, namespace="CELERY")
    define(app, "proj.sync")
    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    assert "CELERY_REDISLOCK_TASKS['proj.*']" in str(info.value)
    app.close()


def test_a_shared_task_and_a_custom_base_are_locked_by_the_config(redis_url: str) -> None:
    class Base(Task):  # type: ignore[misc]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return ("base", super().__call__(*args, **kwargs))

    @shared_task(name="proj.shared_unit", shared=True)
    def shared_unit() -> str:
        return "ran"

    app = app_with(redis_url, {"proj.*": {"on_contention": "fail"}})
    custom = define(app, "proj.custom", base=Base)
    app.finalize()
    shared = app.tasks["proj.shared_unit"]
    assert isinstance(shared, LockedTask) and isinstance(custom, LockedTask)
    assert custom.apply((1,)).get() == ("base", "ran")  # eager: locked, and Base.__call__ ran
    assert shared.apply().get() == "ran"
    app.close()


def test_a_pattern_that_matches_nothing_is_reported(redis_url: str) -> None:
    from celery_redislock.tasks import configured

    app = app_with(redis_url, {"proj.sync": {}, "proj.synk*": {}})
    define(app, "proj.sync")
    app.finalize()
    assert configured.unmatched(app) == ["proj.synk*"]
    app.close()


def test_rate_limits_come_from_the_configuration_too(redis_url: str) -> None:
    app = app_with(
        redis_url,
        {
            "proj.api.*": {"global_rate_limit": "100/m", "rate_limit_key": ["user_id"]},
            "proj.stripe": {"rate_limit_group": "shared", "lock_key": ["user_id"]},
        },
        # The group tests/rates_app.py's shared tasks join: Celery copies them
        # into this app as it finalizes, and their group must be known here.
        redislock_rate_limits={"shared": "10/s"},
    )
    api, stripe = define(app, "proj.api.call"), define(app, "proj.stripe")
    app.finalize()
    # A rate alone takes no lock; a rate with a lock option takes both.
    assert api._redislock_rated and not api._redislock_locks
    assert stripe._redislock_rated and stripe._redislock_locks
    settings = lock_config.settings_for(app)
    assert rate_stage.limit_for(api, (7,), {}, settings)[0] == "proj.api.call:[7]"
    assert rate_stage.limit_for(stripe, (7,), {}, settings)[1].per_second == 10.0
    app.close()


def test_a_bad_rate_in_the_configuration_names_the_entry(redis_url: str) -> None:
    app = app_with(redis_url, {"proj.*": {"global_rate_limit": "5/x"}})
    define(app, "proj.limited")
    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    assert "'proj.*'" in str(info.value) and "global_rate_limit" in str(info.value)
    assert "'5/x'" in str(info.value)
