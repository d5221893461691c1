"""What a real worker checks as it starts: where the locks go, and bad settings.

Each test writes a small app module and starts a ``celery worker`` (prefork)
on it.  The broker is kombu's filesystem transport (or RabbitMQ, when one
answers on 127.0.0.1:5672): a broker that is not Redis, so the lock store
has to come from ``redislock_url`` or the result backend.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from tests.helpers import wait_until
from tests.workers import ROOT, Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

APP = """
import os
from celery import Celery
from celery_redislock import LockedTask

app = Celery("startup", broker=os.environ["T_BROKER"], backend=os.environ.get("T_BACKEND") or None)
app.conf.broker_transport_options = {{
    "data_folder_in": os.environ["T_DIR"], "data_folder_out": os.environ["T_DIR"],
    "control_folder": os.environ["T_DIR"] + "-control",
}}
{setup}

@app.task(name="startup.locked", base=LockedTask, on_contention="fail", lock_key=["job"])
def locked(job):
    return job
"""


def rabbitmq_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture(params=["filesystem", "amqp"])
def broker(request: Any, tmp_path: Path) -> str:
    if request.param == "amqp":
        if not rabbitmq_up():
            pytest.skip("no RabbitMQ on 127.0.0.1:5672")
        return "amqp://guest:guest@127.0.0.1:5672//"
    (tmp_path / "q").mkdir()
    return "filesystem://"


def worker_on(
    tmp_path: Path, redis_base: str, broker: str, backend: str, setup: str = ""
) -> Worker:
    module = f"startup_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(APP.format(setup=textwrap.dedent(setup)))
    (tmp_path / "q").mkdir(exist_ok=True)
    env = {
        "PYTHONPATH": f"{ROOT}:{tmp_path}",
        "T_BROKER": broker,
        "T_BACKEND": backend,
        "T_DIR": str(tmp_path / "q"),
    }
    return Worker(redis_base, concurrency=1, name=module, app=module, env=env)


def test_with_a_non_redis_broker_the_locks_go_to_the_redis_result_backend(
    tmp_path: Path, redis_base: str, broker: str, stopped: list[Worker]
) -> None:
    backend = f"{redis_base}/7"
    store = redis.Redis.from_url(backend)
    store.flushdb()
    worker = worker_on(tmp_path, redis_base, broker, backend)
    stopped.append(worker)
    worker.wait_ready()
    port = redis_base.rsplit(":", 1)[1]
    lines = [x for x in worker.output().splitlines() if "celery_redislock: lock store" in x]
    assert len(lines) == 1, lines
    assert f"redis://127.0.0.1:{port}/7 (from result_backend)" in lines[0]

    # A run takes its lock there (its fence key stays for the retention time).
    client = Celery("startup-client", broker=broker, backend=backend, set_as_current=False)
    client.conf.broker_transport_options = {
        "data_folder_in": str(tmp_path / "q"),
        "data_folder_out": str(tmp_path / "q"),
        "control_folder": str(tmp_path / "q") + "-control",
    }
    try:
        assert client.send_task("startup.locked", args=["j1"]).get(timeout=20) == "j1"
    finally:
        client.close()
    assert [k for k in store.keys("*j1*") if k.endswith(b":fence")]
    store.flushdb()


def test_without_any_redis_the_worker_refuses_to_start_saying_how_to_set_one(
    tmp_path: Path, redis_base: str, stopped: list[Worker]
) -> None:
    worker = worker_on(tmp_path, redis_base, "filesystem://", "")
    stopped.append(worker)
    wait_until(lambda: worker.proc.poll() is not None, 30, what="the worker to exit")
    out = worker.output()
    assert worker.proc.returncode != 0
    assert "redislock_url = 'redis://host:6379/0'" in out, out
    assert "neither the broker (filesystem) nor the result backend (not set)" in out
    assert " ready." not in out


@pytest.mark.parametrize(
    ("setup", "spelled"),
    [
        (
            "app.conf.update(redislock_url={url!r}, redislock_lock_ttl=-1)",
            "redislock_lock_ttl",
        ),
        (
            """
            class Settings:
                CELERY_REDISLOCK_URL = {url!r}
                CELERY_REDISLOCK_LOCK_TTL = -1
            app.config_from_object(Settings, namespace="CELERY")
            """,
            "CELERY_REDISLOCK_LOCK_TTL",
        ),
    ],
    ids=["plain", "namespaced"],
)
def test_a_bad_setting_stops_the_worker_naming_the_key_as_the_app_spells_it(
    tmp_path: Path, redis_base: str, stopped: list[Worker], setup: str, spelled: str
) -> None:
    setup = setup.format(url=f"{redis_base}/0")
    worker = worker_on(tmp_path, redis_base, "filesystem://", "", setup=setup)
    stopped.append(worker)
    wait_until(lambda: worker.proc.poll() is not None, 30, what="the worker to exit")
    out = worker.output()
    assert worker.proc.returncode != 0
    assert f"ConfigurationError: {spelled} must be a positive number of seconds, got -1" in out, out
    assert " ready." not in out


UNANNOTATED = """
import os
from celery import Celery

app = Celery("unannotated", broker=os.environ["T_BROKER"])
app.conf.broker_transport_options = {{
    "data_folder_in": os.environ["T_DIR"], "data_folder_out": os.environ["T_DIR"],
    "control_folder": os.environ["T_DIR"] + "-control",
}}
app.conf.redislock_url = os.environ["T_LOCKS"]
app.conf.redislock_tasks = {{"unannotated.job": {{"lock_key": ["job"]}}}}
{setup}

@app.task(name="unannotated.job")
def job(job):
    return job
"""


@pytest.mark.parametrize(
    "setup",
    ["", "from celery_redislock import LockedTask\n@app.task(base=LockedTask)\ndef other(): pass"],
    ids=["library-never-imported", "library-imported"],
)
def test_redislock_tasks_without_configured_locks_stops_the_worker_saying_so(
    tmp_path: Path, redis_base: str, stopped: list[Worker], setup: str
) -> None:
    """Without ``ConfiguredLocks()`` in task_annotations, Celery never asks it
    about a task: the patterns would lock nothing, silently.  The worker
    refuses to start, even when nothing of the project imports the library
    (the ``celery`` command loads it as a plugin)."""
    module = f"unannotated_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(UNANNOTATED.format(setup=setup))
    (tmp_path / "q").mkdir(exist_ok=True)
    env = {
        "PYTHONPATH": f"{ROOT}:{tmp_path}",
        "T_BROKER": "filesystem://",
        "T_DIR": str(tmp_path / "q"),
        "T_LOCKS": f"{redis_base}/0",
    }
    worker = Worker(redis_base, concurrency=1, name=module, app=module, env=env)
    stopped.append(worker)
    wait_until(lambda: worker.proc.poll() is not None, 30, what="the worker to exit")
    out = worker.output()
    assert worker.proc.returncode != 0
    assert "redislock_tasks is set, but task_annotations has no" in out, out
    assert "task_annotations = [ConfiguredLocks()]" in out
    assert " ready." not in out

    # `celery redislock check` says the same, and exits non-zero.
    check = subprocess.run(
        [sys.executable, "-m", "celery", "-A", module, "redislock", "check"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert check.returncode != 0
    assert "task_annotations has no celery_redislock.ConfiguredLocks()" in check.stderr


def test_redislock_check_lists_the_locked_tasks_and_reaches_the_store(
    tmp_path: Path, redis_base: str
) -> None:
    module = f"checked_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(APP.format(setup=""))
    (tmp_path / "q").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}:{tmp_path}",
        "T_BROKER": "filesystem://",
        "T_BACKEND": f"{redis_base}/2",
        "T_DIR": str(tmp_path / "q"),
    }
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", module, "redislock", "check"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "(from result_backend), reached" in out.stdout
    assert "startup.locked (lock_key=['job'], on_contention='fail'; from code)" in out.stdout
