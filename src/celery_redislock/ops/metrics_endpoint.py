"""The ``/metrics`` endpoint: which registry it serves, and the HTTP server.

In prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) the
endpoint serves a registry of its own that reads every process's files, as
prometheus_client documents; otherwise this process's default registry.

prometheus_client's own ``start_http_server`` returns nothing to stop it
with in older releases (0.17.0 among them), and a worker closes what it
opens when it stops; so the server is the standard library's WSGI server
around prometheus_client's ``make_wsgi_app``, threaded as theirs is.
"""

from __future__ import annotations

import importlib
import os
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

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


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is no news


class Server:
    """A running endpoint: ``port`` (the one bound), ``close()`` stops it."""

    def __init__(self, httpd: Any) -> None:
        self._httpd = httpd
        self.port: int = httpd.server_address[1]
        self._thread = threading.Thread(
            target=httpd.serve_forever, name="redislock-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def serve(port: int, addr: str = "0.0.0.0", registry: Any = None) -> Server:
    """Serve ``registry`` (default: :func:`endpoint_registry`) on ``addr:port``
    from a daemon thread; port 0 takes a free one (see ``Server.port``)."""
    make_wsgi_app = client().make_wsgi_app
    if registry is None:
        registry = endpoint_registry()
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    server_cls = type("_Server", (_ThreadingServer,), {"address_family": family})
    try:
        httpd: WSGIServer = make_server(
            addr, port, make_wsgi_app(registry), server_cls, _QuietHandler
        )
    except OSError as exc:
        raise ConfigurationError(
            f"metrics endpoint: cannot listen on {addr}:{port}: {exc}"
        ) from exc
    return Server(httpd)
