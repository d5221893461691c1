"""The demo runs on a real worker and its checks hold.

Run as a user runs it (``python -m celery_redislock.demo``: a private
redis-server, a prefork worker), it exits 0 and prints every check with the
figures it measured: one run of five duplicates under ``skip``, every parked
run once and in order, a semaphore's limit never exceeded, the stale write
refused by its fence, one message for five publishes of a unique job, and a
stuck lock listed with its task and pid, freed with a higher fence.
``examples/quickstart/run.py`` runs the same demo.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_server import free_port

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def run_demo(*command: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # its own redis-server
    return subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, timeout=110, env=env
    )


def test_the_demo_passes_every_check_and_prints_its_figures() -> None:
    done = run_demo("-m", "celery_redislock.demo")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "FAIL" not in out and "all 8 checks passed" in out, out
    assert "ok   retry: 4 of 4 runs ran; one user's runs overlapped at most 1 at a time" in out
    assert "ok   skip: 1 of 5 duplicate runs ran (4 skipped with TaskSkipped)" in out
    assert (
        "ok   park: 6 runs ran, in the order [0, 1, 2, 3, 4, 5] (sent [0, 1, 2, 3, 4, 5]); "
        "5 parked, at most 1 running at once"
    ) in out
    assert re.search(r"ok   semaphore: 6 of 6 runs ran, at most [12] at once \(limit 2\)", out)
    fence = re.search(
        r"ok   fence: the stalled run's write with fence (\d+) was refused; "
        r"the store holds '200', written with fence (\d+)",
        out,
    )
    assert fence and int(fence[1]) < int(fence[2]), out
    assert "ok   unique: 5 publishes sent 1 message(s): 1 job, 1 run" in out

    # Operating: `celery redislock ls` lists the stuck run's hold with its task,
    # worker and pid; `release` frees it with a higher fence; the next run goes.
    listed = re.search(
        r"lock\s+demo\.rebuild_report\s+exclusive\s+demo\.rebuild_report\[([0-9a-f-]+)\]"
        r"\s+(celery@\S+)\s+(\d+)\s+(\d+)",
        out,
    )
    assert listed, out
    fences = re.search(r"new fence (\d+) \(was (\d+)\)", out)
    assert fences and int(fences[1]) > int(fences[2]) == int(listed[4]), out
    operating = re.search(
        r"ok   operating: ls showed the stuck hold \(demo\.rebuild_report\[([0-9a-f]{8})\] "
        r"pid (\d+)\); release raised its fence (\d+) -> (\d+); the next run went ahead",
        out,
    )
    assert operating, out
    assert listed[1].startswith(operating[1]) and operating[2] == listed[3], out
    assert "the freed run's worker reported lock_lost" in out


def test_the_quickstart_runs_the_same_demo_and_says_in_one_line_when_redis_is_unreachable() -> None:
    """run.py is the same entry point; a Redis it cannot reach is one line, exit 2."""
    port = free_port()
    env = dict(os.environ, REDIS_URL=f"redis://127.0.0.1:{port}/0")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart" / "run.py")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"demo: cannot reach Redis at redis://127.0.0.1:{port}/2"), lines


def test_with_too_old_a_redis_server_the_demo_says_so_in_one_line(tmp_path: Path) -> None:
    """The server comes from celery_redislock.testing.server: one refused is one line."""
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'Redis server v=5.0.7 sha=00000000:0 malloc=libc'\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["REDISLOCK_REDIS_SERVER"] = str(fake)
    done = subprocess.run(
        [sys.executable, "-m", "celery_redislock.demo"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("demo: "), done.stderr
    assert "Redis 5.0.7" in lines[0] and "6.2" in lines[0], lines
