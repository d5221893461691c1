"""The ``/metrics`` endpoint: which registry it serves, and the HTTP server.

In prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) the
endpoint serves a registry of its own that reads every process's files, as
prometheus_client documents; otherwise this process's default registry.

The server is prometheus_client's own (``start_http_server``, which returns
the server to stop from 0.20 on: a worker closes what it opens).
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any, Optional

from ..exceptions import ConfigurationError

__all__ = [
    "MULTIPROC_ENV",
    "Server",
    "client",
    "endpoint_registry",
    "multiproc_dir",
    "multiprocess",
    "serve",
]

#: The environment variable of prometheus_client's multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def client(why: str = "celery_redislock's metrics") -> Any:
    """The prometheus_client module, or a ConfigurationError naming the extra."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(
            f"{why} needs prometheus_client: pip install 'celery-redislock[prometheus]'"
        ) from exc
    return prometheus_client


def multiproc_dir() -> Optional[str]:
    """The multiprocess directory, or None; checked, so that nothing recorded goes unseen."""
    # Set at all, it is multiprocess mode to prometheus_client.
    path = os.environ.get(MULTIPROC_ENV)
    if path is None:
        return None
    if not os.path.isdir(path):
        raise ConfigurationError(f"{MULTIPROC_ENV}={path!r} is not a directory")
    client()
    from prometheus_client import values

    if values.ValueClass is values.MutexValue:
        # prometheus_client picks its mode once, as it is imported.
        raise ConfigurationError(
            f"prometheus_client was imported before {MULTIPROC_ENV} was set: set it "
            "in the environment the process starts with"
        )
    return path


def endpoint_registry() -> Any:
    """What an endpoint serves: every process's metrics in multiprocess mode,
    else this process's default registry."""
    pc = client()
    path = multiproc_dir()
    if path is None:
        return pc.REGISTRY
    collected = pc.CollectorRegistry()
    multiprocess().MultiProcessCollector(collected, path=path)
    return collected


def multiprocess() -> Any:
    """prometheus_client's multiprocess module."""
    return importlib.import_module("prometheus_client.multiprocess")


class Server:
    """A running endpoint: ``port`` (the one bound), ``close()`` stops it."""

    def __init__(self, httpd: Any, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self.port: int = httpd.server_address[1]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def serve(port: int, addr: str = "0.0.0.0", registry: Any = None) -> Server:
    """Serve ``registry`` (default: :func:`endpoint_registry`) on ``addr:port``
    from a daemon thread; port 0 takes a free one (see ``Server.port``)."""
    pc = client()
    if registry is None:
        registry = endpoint_registry()
    try:
        httpd, thread = pc.start_http_server(port, addr, registry)
    except OSError as exc:
        raise ConfigurationError(
            f"metrics endpoint: cannot listen on {addr}:{port}: {exc}"
        ) from exc
    return Server(httpd, thread)
