"""Start and stop private redis-server processes on free loopback ports."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throwaway redis-server: ``start()``, ``kill()``, ``restart()`` on the same port."""

    def __init__(self, port: int | None = None, extra: list[str] | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="redislock-test-")
        self.proc: subprocess.Popen[bytes] | None = None
        #: More redis-server options (``["--requirepass", "s3cret"]``, TLS, ...).
        self.extra = list(extra or [])
        #: Options of the client that checks the server is up.
        self.ping_options: dict[str, object] = {}

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--loglevel",
                "warning",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, **self.ping_options)
        try:
            while True:
                try:
                    if client.ping():
                        break
                except (redis.ConnectionError, redis.ResponseError):
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        message = f"redis-server did not start on port {self.port}"
                        raise RuntimeError(message) from None
                    time.sleep(0.02)
        finally:
            client.close()
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)
