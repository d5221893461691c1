"""``celery redislock web``: a page listing what ``ls`` lists, refreshed every second.

The page (``static/``: one HTML file, one script, one stylesheet) reads
``GET /api/entries`` (every entry's :meth:`~.entries.Entry.as_dict`, the
stats, and the store as :func:`config.describe_store` shows it, never with
its password) and counts leases down between reads.

Served by the stdlib's :class:`http.server.ThreadingHTTPServer`, not a
library from an extra: five fixed routes, no templates, no sessions; what a
framework would add (routing, parsing) is a dict and ``json.loads`` here, and
what matters (the headers, the token and origin checks) would be ours to
write either way.  The stdlib server is not hardened for the open internet;
this view binds to 127.0.0.1 unless told otherwise.

Read-only unless started with ``--allow-release``.  Then ``POST
/api/release`` frees a hold, and only when the request carries the random
token printed at start (``Authorization: Bearer``, compared in constant
time), the ``X-Redislock: release`` header, a JSON body, and no foreign
``Origin``: a form or a page of another site can send none of these without
a CORS preflight, which is never granted.  On a loopback address, a request
naming any other ``Host`` is refused (DNS rebinding).
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import secrets
import socket
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

import click
import redis
from celery.bin.base import CeleryCommand

from .. import config
from ..exceptions import ConfigurationError, RedisLockError
from .entries import Kind
from .inspect import Inspector

__all__ = ["WebServer", "WebView", "make_server", "web"]

#: Files of the page, by route: (file in static/, content type).
PAGES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/app.css": ("app.css", "text/css; charset=utf-8"),
}
JSON = "application/json; charset=utf-8"
#: The header a release must carry: a custom header, so a cross-site page
#: cannot send it without a preflight (never granted here).
RELEASE_HEADER = ("X-Redislock", "release")
#: A release body is a kind, a name and a token: far less than this.
MAX_BODY = 64 * 1024
#: What reaching the store may raise: answered 503, with what it says.
STORE_ERRORS = (redis.RedisError, RedisLockError)

#: Sent with every answer.  The page's script is a file of its own, so no
#: inline script (injected into the page, say) may run.
SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
    ("X-Frame-Options", "DENY"),
)


@dataclasses.dataclass(frozen=True)
class Reply:
    """An answer: status, body, content type."""

    status: int
    body: bytes = b""
    content_type: str = JSON


def _json(status: int, data: Any) -> Reply:
    return Reply(status, json.dumps(data).encode())


def _error(status: int, message: str) -> Reply:
    return _json(status, {"error": message})


class WebView:
    """What the web view answers; :class:`_Handler` only moves the bytes.

    ``token`` (None: read-only) is what a release must carry; ``hosts``, when
    given, the only ``Host`` values answered (lowercase ``name:port``).
    """

    def __init__(
        self,
        inspector: Inspector,
        *,
        store: Optional[str] = None,
        token: Optional[str] = None,
        hosts: Optional[frozenset[str]] = None,
    ) -> None:
        self.inspector = inspector
        self.store = store
        self.token = token
        self.hosts = hosts
        static = resources.files(__package__ or "celery_redislock.ops").joinpath("static")
        self.pages = {
            route: Reply(200, static.joinpath(file).read_bytes(), kind)
            for route, (file, kind) in PAGES.items()
        }

    def get(self, target: str, headers: Any) -> Reply:
        if not self._host_ok(headers):
            return _error(403, "unknown Host")
        url = urlsplit(target)
        if url.path in self.pages:
            return self.pages[url.path]
        if url.path == "/favicon.ico":
            return Reply(204)
        if url.path == "/api/entries":
            return self._entries(parse_qs(url.query))
        return _error(404, "not found")

    def post(self, target: str, headers: Any, body: bytes) -> Reply:
        if urlsplit(target).path != "/api/release" or self.token is None:
            return _error(404, "not found (releasing needs --allow-release)")
        if not self._host_ok(headers):
            return _error(403, "unknown Host")
        refusal = self._refusal(headers)
        if refusal is not None:
            return refusal
        try:
            asked = json.loads(body)
            kind = Kind(asked["kind"])
            name, holder = asked["name"], asked.get("holder")
            if not isinstance(name, str) or not (holder is None or isinstance(holder, str)):
                raise TypeError("name and holder are strings")
        except (ValueError, TypeError, KeyError) as exc:
            return _error(400, f"a release is {{kind, name, holder?}}: {exc}")
        try:
            released = self.inspector.release(name, kind, holder=holder)
        except STORE_ERRORS as exc:
            return _error(503, f"lock store: {type(exc).__name__}: {exc}")
        return _json(200, {"released": [r.as_dict() for r in released]})

    def _entries(self, query: dict[str, list[str]]) -> Reply:
        pattern = query.get("pattern", ["*"])[0]
        try:
            kind = Kind(query["kind"][0]) if "kind" in query else None
        except ValueError:
            return _error(400, f"kind is one of {', '.join(k.value for k in Kind)}")
        try:
            entries = self.inspector.entries(pattern, kind)
            stats = self.inspector.stats(entries)
        except STORE_ERRORS as exc:
            # (redis-py's messages name the host and port, never a password.)
            return _error(503, f"lock store: {type(exc).__name__}: {exc}")
        return _json(
            200,
            {
                "entries": [e.as_dict() for e in entries],
                "stats": stats.as_dict(),
                "store": self.store,
                "prefix": self.inspector.prefix,
                "release": self.token is not None,
            },
        )

    def _host_ok(self, headers: Any) -> bool:
        return self.hosts is None or str(headers.get("Host", "")).lower() in self.hosts

    def _refusal(self, headers: Any) -> Optional[Reply]:
        """Why a release request is refused, or None: see the module docstring."""
        origin = headers.get("Origin")
        if origin is not None and origin != f"http://{headers.get('Host', '')}":
            return _error(403, "cross-origin request")
        if headers.get("Sec-Fetch-Site") not in (None, "same-origin", "none"):
            return _error(403, "cross-site request")
        if headers.get_content_type() != "application/json":
            return _error(415, "a release is sent as application/json")
        if headers.get(RELEASE_HEADER[0]) != RELEASE_HEADER[1]:
            return _error(403, f"a release carries the header {': '.join(RELEASE_HEADER)}")
        scheme, _, given = str(headers.get("Authorization", "")).partition(" ")
        expected = (self.token or "").encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), expected):
            return _error(403, "a release needs the token printed when the web view started")
        return None


class WebServer(ThreadingHTTPServer):
    """The stdlib's threading server, answering with a :class:`WebView`
    (``view``, set by :func:`make_server`)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        super().__init__(address, _Handler)
        self.view: Optional[WebView] = None

    def server_bind(self) -> None:
        # HTTPServer's own looks the address up in DNS (getfqdn), for a name
        # nothing here uses: a start that may hang on a resolver.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    server: WebServer
    server_version = "celery-redislock"

    def version_string(self) -> str:
        return self.server_version  # (not Python's version: nobody here needs it)

    @property
    def view(self) -> WebView:
        assert self.server.view is not None
        return self.server.view

    def do_GET(self) -> None:
        self._send(self.view.get(self.path, self.headers))

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._send(_error(413, f"a body of 0 to {MAX_BODY} bytes, with its Content-Length"))
            return
        self._send(self.view.post(self.path, self.headers, self.rfile.read(length)))

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        if reply.body:
            self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a page polling every second would fill the terminal."""


def loopback_hosts(bind: str, port: int) -> Optional[frozenset[str]]:
    """The ``Host`` values a server bound to ``bind`` answers: its loopback
    names when ``bind`` is a loopback address, any (None) otherwise."""
    try:
        loopback = bind == "localhost" or ipaddress.ip_address(bind).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return None
    names = {"127.0.0.1", "localhost", "[::1]", f"[{bind}]" if ":" in bind else bind}
    return frozenset(f"{n}:{port}" for n in names)


def make_server(
    inspector: Inspector,
    bind: str = "127.0.0.1",
    port: int = 5599,
    *,
    store: Optional[str] = None,
    token: Optional[str] = None,
) -> WebServer:
    """A server of the web view, bound (port 0: any free port) but not yet serving."""
    server = WebServer((bind, port), socket.AF_INET6 if ":" in bind else socket.AF_INET)
    hosts = loopback_hosts(bind, server.server_address[1])
    server.view = WebView(inspector, store=store, token=token, hosts=hosts)
    return server


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    host = host.decode() if isinstance(host, bytes) else host
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


@click.command(cls=CeleryCommand)
@click.option(
    "--port", type=int, default=5599, show_default=True, help="Port to listen on (0: any free one)."
)
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--allow-release",
    is_flag=True,
    help="Let the page free holds, with a token printed at start.",
)
@click.pass_context
def web(ctx: Any, port: int, bind: str, allow_release: bool) -> None:
    """Serve a page listing the locks in use, refreshed every second."""
    app = ctx.obj.app
    try:
        settings = config.require_store(app)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    store = config.describe_store(settings)
    token = secrets.token_urlsafe(24) if allow_release else None
    try:
        server = make_server(Inspector.from_app(app), bind, port, store=store, token=token)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {bind}:{port}: {exc}") from exc
    url = url_of(server)
    ctx.obj.echo(f"web view of the lock store {store}: {url}")
    if token is None:
        ctx.obj.echo("read-only (start with --allow-release to free holds from the page)")
    else:
        # In the fragment: browsers never send it, so no log or Referer has it.
        ctx.obj.echo(f"release token: {token}")
        ctx.obj.echo(f"open {url}#token={token}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
