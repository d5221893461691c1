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
from redis.backoff import NoBackoff
from redis.retry import Retry

#: Ports handed out by free_port() in this process: never handed out twice.
_given: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, not handed out before by this process.

    Free when asked is all it can be: something else (an outgoing connection's
    ephemeral port) may still take it before the server binds it, so a server
    that does not start on a port it did not ask for is started on another.
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _given:
            _given.add(port)
            return port


class RedisServer:
    """A throwaway redis-server: ``start()``, ``kill()``, ``restart()`` on the same port."""

    #: How many times start() tries a new port when the server exits at once.
    PORT_TRIES = 3

    def __init__(self, port: int | None = None, extra: list[str] | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        #: Whether the port was picked here (and so may be picked again).
        self.picked = port is None
        #: Whether it has started once (a restart stays on its port).
        self.started = False
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
        for tries_left in range(self.PORT_TRIES - 1, -1, -1):
            try:
                return self._start()
            except RuntimeError:
                exited = self.proc is not None and self.proc.poll() is not None
                if not (exited and self.picked and not self.started and tries_left):
                    raise  # (a restart keeps its port: clients know it)
                self.repick()
        raise AssertionError("unreachable")

    def repick(self) -> None:
        """A new port, after a start on this one failed (taken meanwhile)."""
        self.port = free_port()

    def _start(self) -> RedisServer:
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
        client = redis.Redis(
            port=self.port,
            socket_connect_timeout=0.2,
            socket_timeout=1.0,
            retry=Retry(NoBackoff(), 0),
            **self.ping_options,
        )
        try:
            while True:
                try:
                    # (Its own answer: what answers may be another process on that port.)
                    if int(client.info("server")["process_id"]) == self.proc.pid:
                        break
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    pass
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()
        self.started = True
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
