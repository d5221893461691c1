"""examples/django and examples/fastapi run as their READMEs say, on real prefork workers.

Django: ``manage.py enqueue_duplicates --n 5`` against ``celery -A proj worker``
reports one run of five duplicates of the ``base=LockedTask`` task (four skipped),
and five runs one at a time of the task locked only by ``CELERY_REDISLOCK_TASKS``.
FastAPI: duplicate requests for a user's sync get that user's one job id, and
each user's job runs once.
"""

from __future__ import annotations

import gc
import importlib
import os
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis

from celery_redislock import config
from tests.helpers import wait_until
from tests.redis_server import free_port
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# The examples' databases on the session's server: no other test uses these.
DJANGO_DB, DJANGO_LOCKS_DB, FASTAPI_DB = 10, 11, 12


def example_env(example: str, **env: str) -> dict[str, str]:
    """The environment of a command run in ``examples/<example>``, as a user runs it."""
    path = os.pathsep.join([str(EXAMPLES / example), str(ROOT)])
    return {"PYTHONPATH": path, **env}


def start(redis_base: str, example: str, app: str, env: dict[str, str]) -> Worker:
    worker = Worker(redis_base, name=f"example-{example}", app=app, env=example_env(example, **env))
    try:
        return worker.wait_ready()
    except BaseException:
        worker.stop()
        raise


# -- Django ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def django_env(
    redis_base: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The example's environment, metrics on as docker/compose.yaml has them."""
    pytest.importorskip("django", reason="the test extra's django is not installed")
    env = {
        "REDIS_URL": f"{redis_base}/{DJANGO_DB}",
        "REDISLOCK_URL": f"{redis_base}/{DJANGO_LOCKS_DB}",
        "METRICS_PORT": str(free_port()),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path_factory.mktemp("django-metrics")),
    }
    for db in (DJANGO_DB, DJANGO_LOCKS_DB):
        with redis.Redis.from_url(f"{redis_base}/{db}") as r:
            r.flushdb()
    yield env


def test_django_enqueue_duplicates_reports_one_run_under_skip_and_configured_parking(
    redis_base: str, django_env: dict[str, str]
) -> None:
    worker = start(redis_base, "django", "proj", django_env)
    try:
        done = subprocess.run(
            [sys.executable, "manage.py", "enqueue_duplicates", "--n", "5", "--account", "7"],
            cwd=EXAMPLES / "django",
            env={**os.environ, **example_env("django", **django_env)},
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        port = django_env["METRICS_PORT"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            metrics = page.read().decode()
        log = worker.output()
    finally:
        worker.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        'sync_account(7) x 5 (base=LockedTask, on_contention="skip"): '
        "1 ran, 4 skipped, 0 failed; at most 1 running at once",
        'rebuild_statement(7) x 5 (CELERY_REDISLOCK_TASKS, on_contention="park"): '
        "5 ran, 0 skipped, 0 failed; at most 1 running at once",
    ], done.stdout + done.stderr
    # The worker read the CELERY_ names: its lock store, and the task locked by pattern.
    assert f"lock store {django_env['REDISLOCK_URL']} (from CELERY_REDISLOCK_URL)" in log, log
    assert (
        "accounts.tasks.rebuild_statement (lock_key=['account_id'], on_contention='park'; "
        "from redislock_tasks['accounts.tasks.rebuild_*'])"
    ) in log, log
    assert "accounts.tasks.sync_account (lock_key=['account_id'], on_contention='skip'; " in log
    # The worker's /metrics (the compose stack's Prometheus scrapes it) counted them.
    for line in (
        'celery_redislock_acquired_total{kind="lock",task="accounts.tasks.sync_account"} 1.0',
        'celery_redislock_skipped_total{kind="lock",task="accounts.tasks.sync_account"} 4.0',
        'celery_redislock_acquired_total{kind="lock",task="accounts.tasks.rebuild_statement"} 5.0',
    ):
        assert line in metrics.splitlines(), metrics
    # The locks lived in the lock store's database, not in the broker's.
    with redis.Redis.from_url(django_env["REDIS_URL"]) as broker:
        assert not [k for k in broker.scan_iter() if b"rebuild_statement" in k]


# -- FastAPI ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fastapi_app(redis_base: str) -> Iterator[ModuleType]:
    """examples/fastapi/main.py, imported as uvicorn would, on db FASTAPI_DB."""
    pytest.importorskip("fastapi", reason="the test extra's fastapi is not installed")
    url = f"{redis_base}/{FASTAPI_DB}"
    with redis.Redis.from_url(url) as r:
        r.flushdb()
    old_url, old_path = os.environ.get("REDIS_URL"), list(sys.path)
    os.environ["REDIS_URL"] = url
    sys.path.insert(0, str(EXAMPLES / "fastapi"))
    try:
        main = importlib.import_module("main")
    finally:
        sys.path[:] = old_path
        if old_url is None:
            del os.environ["REDIS_URL"]
        else:
            os.environ["REDIS_URL"] = old_url
    yield main
    # Close what this process opened (the lock store's client, the result backend's
    # and the broker's connections) before the modules go: no unclosed socket.
    celery_app = main.celery_app
    # First the requests' AsyncResults: Celery 5.3's unsubscribe as they go.
    gc.collect()
    config.client_for(celery_app).close()
    config.reset(celery_app)
    # Celery 5.3 gives each thread a result backend of its own (the endpoints ran in
    # the server's thread pool): close every one this app made, found through gc.
    for backend in [o for o in gc.get_objects() if isinstance(o, type(celery_app.backend))]:
        if backend.app is celery_app:
            backend.result_consumer.stop()  # its pubsub, subscribed at each publish
            backend.client.connection_pool.disconnect()
    celery_app.close()
    for name in ("main", "jobs"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def client(fastapi_app: ModuleType) -> Iterator[object]:
    with warnings.catch_warnings():
        # A starlette that prefers httpx2 says so when it finds only httpx (Python
        # < 3.11, where httpx2 does not install); either client works.
        warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
        from fastapi.testclient import TestClient
    with TestClient(fastapi_app.app) as test_client:
        yield test_client


def test_fastapi_duplicate_requests_get_one_job_per_user_and_each_runs_once(
    redis_base: str, fastapi_app: ModuleType, client: object
) -> None:
    url = f"{redis_base}/{FASTAPI_DB}"
    worker = start(redis_base, "fastapi", "jobs", {"REDIS_URL": url})
    try:
        users, requests = [1, 2, 3], 4
        answers = [
            client.post(f"/users/{user}/sync").json()  # type: ignore[attr-defined]
            for _ in range(requests)
            for user in users
        ]
        by_user = {u: [a for a in answers if a["user_id"] == u] for u in users}
        for got in by_user.values():
            assert len({a["job_id"] for a in got}) == 1, got
            assert [a["duplicate"] for a in got] == [False] + [True] * (requests - 1), got
        jobs = {user: got[0]["job_id"] for user, got in by_user.items()}
        assert len(set(jobs.values())) == len(users)

        def finished() -> list[dict[str, object]]:
            states = [client.get(f"/jobs/{j}").json() for j in jobs.values()]  # type: ignore[attr-defined]
            return states if all(s["state"] == "SUCCESS" for s in states) else []

        states = wait_until(finished, timeout=30, interval=0.1)
        # Each job's result is its user's count of syncs: the first and only.
        assert [s["result"] for s in states] == [1, 1, 1], states
        with redis.Redis.from_url(url) as r:
            time.sleep(0.5)  # a duplicate run, were there one, would count by now
            assert [int(r.get(f"syncs:{u}") or 0) for u in users] == [1, 1, 1]
        # The job has finished: its key is free, and the next request queues a new one.
        again = client.post("/users/1/sync").json()  # type: ignore[attr-defined]
        assert again["duplicate"] is False and again["job_id"] != jobs[1], again
        second = wait_until(
            lambda: client.get(f"/jobs/{again['job_id']}").json()["result"],  # type: ignore[attr-defined]
            timeout=30, interval=0.1,
        )  # fmt: skip
        assert second == 2
    finally:
        worker.stop()
