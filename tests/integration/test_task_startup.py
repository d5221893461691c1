"""What a real worker checks as it starts: where the locks go, and bad settings.

Each test writes a small app module and starts a ``celery worker`` (prefork)
on it.  The broker is kombu's filesystem transport (or RabbitMQ, when one
answers on 127.0.0.1:5672): a broker that is not Redis, so the lock store
has to come from ``redislock_url`` or the result backend.
"""

from __future__ import annotations

import socket
import textwrap
from collections.abc import Iterator
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


@pytest.fixture
def stopped() -> Iterator[list[Worker]]:
    workers: list[Worker] = []
    yield workers
    for w in workers:
        w.stop()


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
