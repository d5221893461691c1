"""Start real `celery worker` subprocesses (prefork) for the integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Worker:
    """A `celery -A tests.celery_app worker` subprocess; ``stop()`` sends SIGTERM then SIGKILL."""

    def __init__(
        self,
        redis_base: str,
        concurrency: int = 4,
        pool: str = "prefork",
        name: str = "w1",
        extra: list[str] | None = None,
        app: str = "tests.celery_app",
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log = (
            Path(os.environ.get("TMPDIR", "/tmp")) / f"redislock-worker-{name}-{os.getpid()}.log"
        )
        env = {
            **os.environ,
            "REDISLOCK_TEST_REDIS": redis_base,
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "INFO",
            *(extra or []),
        ]
        # Open for the worker's lifetime; stop() closes it.
        self._logf = open(self.log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30.0) -> Worker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.output()}")
            if b" ready." in self.log.read_bytes():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"worker not ready after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (main process and pool children)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stray pool children
        self._logf.close()
