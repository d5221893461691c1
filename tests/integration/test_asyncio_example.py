"""examples/asyncio/run.py runs as its README says, on both redis-py lines, and checks itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis

from tests.redis_server import free_port

RUN = Path(__file__).resolve().parents[2] / "examples" / "asyncio" / "run.py"


def run(url: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, REDIS_URL=url)
    return subprocess.run(
        [sys.executable, "-W", "error", str(RUN)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_the_asyncio_example_prints_what_it_checked(r: redis.Redis, redis_url: str) -> None:
    done = run(redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "exclusion: the counter reads 50 after 50 increments by 10 coroutines",
        "hand-over: a sync holder released, the coroutine woken holds it; fence rose: True",
        "semaphore: at most 2 of 6 coroutines held a permit at once (limit 2)",
    ]


def test_the_asyncio_example_says_in_one_line_when_redis_is_unreachable() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = run(url)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"asyncio example: cannot reach Redis at {url}")
