"""The processes the demo starts: a worker and ``celery redislock``.

Everything runs as ``sys.executable -m celery -A celery_redislock.demo.tasks``,
so the demo needs no working directory or PYTHONPATH of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

APP = "celery_redislock.demo.tasks"


class Worker:
    """``celery worker -P prefork -c 4`` on the demo app, in its own process group."""

    command = [sys.executable, "-m", "celery", "-A", APP, "worker", "-P", "prefork", "-c", "4",
               "-l", "WARNING", "--without-gossip", "--without-mingle",
               "--without-heartbeat"]  # fmt: skip

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile(prefix="redislock-demo-worker-")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, app: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if app.control.ping(timeout=0.5):
                return
        raise RuntimeError("the worker did not start:\n" + self.output())

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # pool children, if any are left
        self.proc.wait(5)
        self.log.close()


def redislock(*args: str) -> str:
    """Run ``celery -A celery_redislock.demo.tasks redislock ARGS``; its output, after
    the command line as a user would type it.  Raises RuntimeError when it fails."""
    command = [sys.executable, "-m", "celery", "-A", APP, "redislock", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[2:])} failed:\n{done.stdout}{done.stderr}")
    return f"$ celery -A {APP} redislock {' '.join(args)}\n{done.stdout.rstrip()}"
