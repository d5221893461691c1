"""The quickstart demo runs on a real worker and shows what its README says.

Run as a user runs it (``python examples/quickstart/run.py``: a private
redis-server, a prefork worker), its output is checked for the facts each
part claims: one job for five publishes of a unique job, and a stuck lock
found by ``celery redislock ls`` (with its task, worker and pid), freed by
``celery redislock release`` with a higher fence, the next run going ahead
and the freed run told it lost the lock.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_the_quickstart_demo_shows_unique_jobs_and_operating_a_stuck_lock() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # its own redis-server
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart" / "run.py")],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "5 publishes, 1 job" in out and "refresh_feed ran 2 times for 6 publishes" in out
    listed = re.search(
        r"lock\s+tasks\.rebuild_report\s+exclusive\s+tasks\.rebuild_report\[([0-9a-f-]+)\]"
        r"\s+(celery@\S+)\s+(\d+)\s+(\d+)",
        out,
    )
    assert listed, out
    fences = re.search(r"new fence (\d+) \(was (\d+)\)", out)
    assert fences and int(fences[1]) > int(fences[2]) == int(listed[4]), out
    assert "a new rebuild_report" in out and "'report rebuilt'" in out
    assert "the freed run's worker reported lock_lost" in out
