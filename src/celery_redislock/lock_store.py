"""The lock store: where a configuration puts it, the client that reaches it, how to show it.

The forms of a lock store (``redislock_url``, or the broker or result backend it
follows), each with ``socket_timeout``, a connect timeout of at most 5 s and a
health check every 30 s:

- ``redis://``, ``rediss://``, ``unix://`` and Celery's ``redis+socket://``:
  ``redis.Redis.from_url``; ``ssl`` (``redislock_ssl``, as Celery's
  ``redis_backend_use_ssl``) turns TLS on and adds its ``ssl_*`` keywords;
- ``sentinel://host:26379;sentinel://host2:26379`` (or a list of them), Celery's
  Sentinel URL: ``Sentinel(...).master_for(options["master_name"])``; the first
  URL's user, password and database apply to the master, as kombu does;
- ``redis+cluster://host:7000,host:7001`` (``rediss+cluster://`` for TLS):
  ``redis.cluster.RedisCluster`` with those startup nodes.

``options`` (``redislock_transport_options``) holds ``master_name``,
``sentinel_kwargs`` and ``min_other_sentinels`` for Sentinel; its other keys are
connection keywords of every form.  A ``redislock_client`` factory is called
by :mod:`.client_factory` instead; :mod:`.store_source` reads where a
Celery configuration puts the store.  No Celery import here, and the client
is cached per app and process by :mod:`.config`.  Nothing shown ever carries
a password.
"""

from __future__ import annotations

import inspect
import ssl
from collections.abc import Sequence
from typing import Any, Optional, Union
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError
from redis.sentinel import Sentinel

from .client_factory import name_of
from .exceptions import BackendUnavailable, ConfigurationError

__all__ = [
    "SCHEMES",
    "SENTINEL_OPTIONS",
    "connect",
    "describe",
    "tls_options",
]

#: URL schemes of a lock store, as accepted by :func:`connect`.
SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    "redis+socket://",
    "sentinel://",
    "redis+cluster://",
    "rediss+cluster://",
)
#: Keys of the transport options that configure Sentinel itself, not a connection.
SENTINEL_OPTIONS = ("master_name", "min_other_sentinels", "sentinel_kwargs")
_CERT_REQS = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
_SENTINEL_PORT = 26379

Url = Union[str, Sequence[str]]


def connect(
    url: Url,
    *,
    ssl: Optional[dict[str, Any]] = None,
    options: Optional[dict[str, Any]] = None,
    socket_timeout: float = 10.0,
    url_setting: str = "redislock_url",
    options_setting: str = "redislock_transport_options",
) -> Any:
    """A redis-py client of the lock store ``url`` names (see the module docstring).

    ``url_setting`` and ``options_setting`` name where the URL and the options
    came from, for the errors.
    """
    options = dict(options or {})
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": min(socket_timeout, 5.0),
        "health_check_interval": 30,
    }
    urls = _urls(url)
    first = urls[0]
    if first.startswith("sentinel://"):
        return _sentinel(urls, ssl, options, kwargs, url_setting, options_setting)
    if len(urls) > 1:
        raise ConfigurationError(
            f"{url_setting} lists several URLs ({describe(url)}): only sentinel:// URLs "
            "come in a list"
        )
    if not first.startswith(SCHEMES):
        raise ConfigurationError(
            f"{url_setting} must be a URL of one of {', '.join(SCHEMES)}; got {describe(first)}"
        )
    extra = _connection_keywords(options, options_setting)
    for key in SENTINEL_OPTIONS:
        if key in options:
            raise ConfigurationError(
                f"{options_setting}[{key!r}] is for a sentinel:// lock store, "
                f"and {url_setting} is {describe(first)}"
            )
    if first.startswith(("redis+cluster://", "rediss+cluster://")):
        return _cluster(first, ssl, {**kwargs, **extra}, url_setting)
    if first.startswith("redis+socket://"):
        first = "unix://" + first[len("redis+socket://") :]
    if ssl is not None:
        if first.startswith("unix://"):
            raise ConfigurationError(
                f"redislock_ssl is set, and {url_setting} is a unix socket ({describe(first)})"
            )
        # As Celery's redis_backend_use_ssl: the options turn TLS on.
        if first.startswith("redis://"):
            first = "rediss://" + first[len("redis://") :]
        kwargs.update(tls_options(ssl, "redislock_ssl"))
    return redis.Redis.from_url(first, **{**kwargs, **extra})


def tls_options(value: Any, where: str) -> dict[str, Any]:
    """``value`` (a dict of ``ssl_*`` keywords) with ``ssl_cert_reqs`` as an
    ``ssl.VerifyMode``: it may be one, or ``"required"``, ``"optional"``,
    ``"none"`` (also ``"CERT_REQUIRED"`` & co, as in Celery's URLs)."""
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where} must be a dict of ssl_* options, got {value!r}")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key.startswith("ssl_"):
            raise ConfigurationError(
                f"{where} takes ssl_* keys (ssl_cert_reqs, ssl_ca_certs, ssl_certfile, "
                f"ssl_keyfile), got {key!r}"
            )
        out[key] = _cert_reqs(item, where) if key == "ssl_cert_reqs" else item
    return out


def _cert_reqs(value: Any, where: str) -> ssl.VerifyMode:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return ssl.VerifyMode(value)
        except ValueError:
            pass
    elif isinstance(value, str):
        name = value.strip().lower()
        name = name[len("cert_") :] if name.startswith("cert_") else name
        if name in _CERT_REQS:
            return _CERT_REQS[name]
    raise ConfigurationError(
        f"{where}['ssl_cert_reqs'] must be 'required', 'optional', 'none' or an "
        f"ssl.CERT_* constant, got {value!r}"
    )


def _urls(url: Url) -> list[str]:
    parts = url.split(";") if isinstance(url, str) else list(url)
    urls = [p.strip() for p in parts if isinstance(p, str) and p.strip()]
    if not urls or len(urls) != len([p for p in parts if not isinstance(p, str) or p.strip()]):
        raise ConfigurationError(f"a lock store URL must be a non-empty str, got {url!r}")
    return urls


def _connection_keywords(options: dict[str, Any], options_setting: str) -> dict[str, Any]:
    """The keys of ``options`` that are connection keywords; any other key but
    Sentinel's is an error (redis-py would only refuse it at the first command)."""
    known = set(inspect.signature(redis.Redis.__init__).parameters) - {"self", "connection_pool"}
    out = {}
    for key, value in options.items():
        if key in SENTINEL_OPTIONS:
            continue
        if key not in known:
            raise ConfigurationError(
                f"{options_setting}[{key!r}] is not a redis-py connection keyword "
                f"(nor one of {', '.join(SENTINEL_OPTIONS)})"
            )
        out[key] = value
    return out


def _sentinel(
    urls: list[str],
    tls: Optional[dict[str, Any]],
    options: dict[str, Any],
    kwargs: dict[str, Any],
    url_setting: str,
    options_setting: str,
) -> Any:
    addresses = []
    for url in urls:
        if not url.startswith("sentinel://"):
            raise ConfigurationError(
                f"{url_setting} mixes sentinel:// URLs with {describe(url)}: "
                "list only the sentinels"
            )
        parsed = urlsplit(url)
        addresses.append((parsed.hostname or "localhost", parsed.port or _SENTINEL_PORT))
    master_name = options.get("master_name")
    if not isinstance(master_name, str) or not master_name:
        raise ConfigurationError(
            f"a sentinel:// lock store needs the name of its master: set "
            f"{options_setting} = {{'master_name': 'mymaster'}} (got {master_name!r})"
        )
    # The master's connections take the first URL's credentials and database,
    # as kombu's and Celery's Sentinel transports do.
    first = urlsplit(urls[0])
    if first.username:
        kwargs["username"] = unquote(first.username)
    if first.password:
        kwargs["password"] = unquote(first.password)
    db = first.path.strip("/") or dict(parse_qsl(first.query)).get("db")
    if db:
        try:
            kwargs["db"] = int(db)
        except ValueError:
            raise ConfigurationError(
                f"{url_setting}: the database of {describe(urls[0])} must be a number"
            ) from None
    if tls is not None:
        kwargs["ssl"] = True
        kwargs.update(tls_options(tls, "redislock_ssl"))
    kwargs.update(_connection_keywords(options, options_setting))
    sentinel_kwargs = options.get("sentinel_kwargs")
    if sentinel_kwargs is not None and not isinstance(sentinel_kwargs, dict):
        raise ConfigurationError(
            f"{options_setting}['sentinel_kwargs'] must be a dict, got {sentinel_kwargs!r}"
        )
    # The sentinels get the same timeouts unless told otherwise (redis-py gives
    # them none once sentinel_kwargs is set).
    sentinel_kwargs = {
        "socket_timeout": kwargs["socket_timeout"],
        "socket_connect_timeout": kwargs["socket_connect_timeout"],
        **(sentinel_kwargs or {}),
    }
    manager = Sentinel(  # type: ignore[no-untyped-call]
        addresses,
        min_other_sentinels=options.get("min_other_sentinels", 0),
        sentinel_kwargs=sentinel_kwargs,
        **kwargs,
    )
    return manager.master_for(master_name)  # type: ignore[no-untyped-call]


def _cluster(
    url: str,
    tls: Optional[dict[str, Any]],
    kwargs: dict[str, Any],
    url_setting: str,
) -> Any:
    scheme, _, rest = url.partition("://")
    userinfo, _, rest = rest.rpartition("@")
    hosts, _, tail = rest.partition("/")
    if "?" in hosts or tail.strip("/") not in ("", "0"):
        raise ConfigurationError(
            f"{url_setting}: a Redis Cluster URL is only its nodes "
            f"(redis+cluster://host:7000,host:7001), got {describe(url)}"
        )
    nodes = []
    for node in hosts.split(","):
        host, _, port = node.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(
                f"{url_setting}: each node of a Redis Cluster URL is host:port, "
                f"got {node!r} in {describe(url)}"
            )
        nodes.append(ClusterNode(host.strip("[]"), int(port)))  # type: ignore[no-untyped-call]
    if userinfo:
        user, _, password = userinfo.partition(":")
        if user:
            kwargs["username"] = unquote(user)
        if password:
            kwargs["password"] = unquote(password)
    if scheme == "rediss+cluster" or tls is not None:
        kwargs["ssl"] = True
        kwargs.update(tls_options(tls or {}, "redislock_ssl"))
    try:
        return RedisCluster(startup_nodes=nodes, **kwargs)
    except (RedisClusterException, RedisError) as exc:
        # RedisCluster asks a node for the slots as it is built.
        raise BackendUnavailable(f"lock store {describe(url)} unreachable: {exc}") from exc


def describe(
    url: Optional[Url], options: Optional[dict[str, Any]] = None, client: Any = None
) -> str:
    """Where the lock store is, never with a password: ``redis://host:6379/0``,
    ``sentinel://h1:26379,h2:26379 (master mymaster, db 0)``,
    ``redis+cluster://h1:7000,h2:7001``, or the client factory's name."""
    if client is not None:
        return f"the client of {name_of(client)}"
    if not url:
        return "none"
    urls = _urls(url)
    if urls[0].startswith("sentinel://"):
        first = urlsplit(urls[0])
        db = first.path.strip("/") or dict(parse_qsl(first.query)).get("db") or "0"
        where = ",".join(_host_port(u, _SENTINEL_PORT) for u in urls)
        master = (options or {}).get("master_name") or "?"
        return f"sentinel://{_user(first.username)}{where} (master {master}, db {db})"
    if urls[0].startswith(("redis+cluster://", "rediss+cluster://")):
        scheme, _, rest = urls[0].partition("://")
        userinfo, _, rest = rest.rpartition("@")
        user = userinfo.partition(":")[0]
        return f"{scheme}://{_user(user)}{rest.partition('/')[0].partition('?')[0]}"
    parsed = urlsplit(urls[0])
    unix = parsed.scheme in ("unix", "redis+socket")
    where = parsed.path if unix else _host_port(urls[0], 6379)
    query = dict(parse_qsl(parsed.query))
    path_db = parsed.path.strip("/") if parsed.scheme in ("redis", "rediss") else ""
    db = query.get("db") or path_db or "0"
    return f"{parsed.scheme}://{_user(parsed.username)}{where}/{db}"


def _host_port(url: str, default_port: int) -> str:
    parsed = urlsplit(url)
    try:
        port = parsed.port
    except ValueError:
        port = None
    return f"{parsed.hostname or 'localhost'}:{port or default_port}"


def _user(name: Optional[str]) -> str:
    return f"{unquote(name)}@" if name else ""
