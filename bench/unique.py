"""Unique-jobs benchmark: deduplication at publish time, celery_redislock against its peers.

Starts one private redis-server on a free loopback port (the uniqueness store
on db 0, the broker on db 1; no worker consumes, so published messages stay in
the queue) and measures, in one run, ``apply_async`` of:

* celery_redislock, ``LockedTask`` with ``unique="until_finished"`` (skipped,
  with a note, when the installed version has no unique jobs);
* the shims of :mod:`celery_redislock.compat` (``QueueOnce``, ``Singleton``),
  configured as the originals below are;
* celery-once (``QueueOnce``, its Redis backend, its defaults: a duplicate
  raises ``AlreadyQueued``);
* celery-singleton (``Singleton``: a duplicate returns the first task's id);
* celery-heimdall (``heimdall={"unique": True}``), non-blocking, and with its
  defaults (a duplicate polls the lock for 1 s before it gives up);
* celery-once-task (``OnceTask``: a duplicate returns None);
* a reference unique publish written here (one ``SET NX PX GET``, then the
  send), plain Celery (no deduplication), and three baselines: a bare ``SET
  key value NX PX ttl`` through redis-py made right before Celery's send (the
  unit of a new key's store step), the same ``SET NX PX`` alone, back to back
  (the unit of a duplicate), and one ``EVALSHA`` doing it or else a ``GET``.

Per contender:

1. Round trips to the uniqueness store per ``apply_async``, for a new key and
   for a duplicate, counted client-side: the connection class of each
   library's own redis-py client is swapped for a subclass that records every
   ``send_packed_command`` (one command, or one whole pipeline, per call: one
   round trip).  An untimed pass, after a warm-up, under ``MONITOR`` as well:
   the server's count of requests to db 0 checks that no library talks to the
   store through a client that was not counted, and lists what scripts ran.
   Another untimed pass reads Redis's own time for those commands (SLOWLOG
   with no threshold; not under MONITOR, which slows every call of a script).
2. Wall time per ``apply_async``, new key and duplicate, and its store step:
   the whole call minus the time spent inside Celery's own
   ``Task.apply_async`` (building and sending the message), which every peer
   reaches through ``super()``.  A duplicate sends nothing: its whole call is
   the store step.  Broker messages per duplicate: the queue length before
   and after the duplicates.
3. The ratio of each store step to a bare ``SET NX PX`` timed in the same
   batch (the median, over batches, of the ratio of the two batch medians):
   a new key's against the ``SET NX PX`` made right before the same send
   (after a send, a store step runs with its caches cold: the same bare call
   takes about 1.3x what it takes in a tight loop), a duplicate's against
   the ``SET NX PX`` of a held key in a tight loop, as duplicates run.
4. 50 concurrent producers publishing the same key at once, after a barrier,
   as threads and as forked processes: messages queued per key and whether
   every caller got the queued message's task id back (or the peer's "already
   queued" exception).

The timed calls run in interleaved batches (every contender, in rotating
order, then again), so load from elsewhere on the machine spreads over all of
them.  Prints a Markdown table; a benchmark, not a test: it never asserts.

    python bench/unique.py [--publishes N] [--batches N] [--producers N] [--race-keys N]
                           [--race threads|processes|both]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import multiprocessing
import os
import platform
import statistics
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Optional

import redis
from common import log, peak_overlap, private_server, split

#: Databases of the private server.
LOCK_DB, BROKER_DB = 0, 1
#: The queue every contender publishes to (kombu's Redis transport: a list of that name).
QUEUE = "celery"
#: The lease of the store's key where the contender lets it be set (one hour,
#: celery-once's, celery-heimdall's and celery-once-task's default).
TTL_S = 3600
#: Untimed calls of each kind before anything is counted or timed.
WARMUP = 20
#: Calls of each kind whose round trips are counted.
COUNTED = 50
#: Duplicates (counted / timed in all) for a contender whose duplicate takes
#: about a second (celery-heimdall's default blocking acquire).
SLOW_DUPS = 5
#: Keys raced for such a contender.
SLOW_RACE_KEYS = 3

now = time.monotonic  # CLOCK_MONOTONIC: one clock for every process


# -- counting round trips ------------------------------------------------------------


class Recorder:
    """Round trips of every instrumented client, while ``on``: (client label, command
    names, whether the send happened inside Celery's own ``Task.apply_async``)."""

    on = False
    sends: list[tuple[str, tuple[str, ...], bool]] = []

    @classmethod
    def start(cls) -> None:
        cls.sends = []
        cls.on = True

    @classmethod
    def stop(cls) -> list[tuple[str, tuple[str, ...], bool]]:
        cls.on = False
        return cls.sends


class CountingMixin:
    """Put in front of a redis-py connection class: records each ``send_packed_command``
    (redis-py writes one command, or one whole pipeline, per call, then reads)."""

    bench_label = "?"

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if Recorder.on:
            chunks = [command] if isinstance(command, (bytes, str)) else command
            packed = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
            names = tuple(c[0].decode().upper() for c in parse_commands(packed))
            Recorder.sends.append((self.bench_label, names, bool(getattr(_tls, "depth", 0))))
        super().send_packed_command(command, check_health)  # type: ignore[misc]


def instrument(client: redis.Redis, label: str) -> redis.Redis:
    """Swap the connection class of ``client``'s pool for a counting subclass of it
    (connections already made are closed and dropped first)."""
    pool = client.connection_pool
    base = pool.connection_class
    if not issubclass(base, CountingMixin):
        pool.disconnect()
        pool.reset()
        pool.connection_class = type(
            f"Counting{base.__name__}", (CountingMixin, base), {"bench_label": label}
        )
    return client


def parse_commands(packed: bytes) -> list[tuple[bytes, ...]]:
    """The tests' RESP parser (tests/helpers.py), imported late: common puts the
    checkout on sys.path."""
    from tests.helpers import parse_commands as parse

    return parse(packed)


# -- isolating the broker send ------------------------------------------------------------

_tls = threading.local()


def patch_celery_send() -> None:
    """Time Celery's own ``Task.apply_async`` (message building and the broker send),
    the outermost entry per thread, into ``_tls.send`` / ``_tls.sends``."""
    from celery.app.task import Task

    original = Task.apply_async
    if getattr(original, "bench_timed", False):
        return

    def apply_async(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_tls, "depth", 0):
            return original(self, *args, **kwargs)
        _tls.depth = 1
        t0 = now()
        try:
            return original(self, *args, **kwargs)
        finally:
            _tls.send = getattr(_tls, "send", 0.0) + now() - t0
            _tls.sends = getattr(_tls, "sends", 0) + 1
            _tls.depth = 0

    apply_async.bench_timed = True  # type: ignore[attr-defined]
    Task.apply_async = apply_async  # type: ignore[method-assign]


# -- the contenders ------------------------------------------------------------------------


@dataclass
class Contender:
    label: str
    #: key -> what the caller got (a result, None, ...); may raise the peer's "duplicate".
    publish: Callable[[str], Any]
    #: The library's own client of the store (instrumented).
    clients: list[redis.Redis]
    #: Whether publish goes through Celery (a message per new key).
    celery: bool = True
    #: Whether a duplicate takes about a second (fewer duplicates, fewer race keys).
    slow_dup: bool = False
    #: What the peer does, for the notes under the table.
    note: str = ""
    #: Exceptions that mean "already queued".
    duplicate_errors: tuple[type[BaseException], ...] = ()
    #: Not measured at all when a duplicate is sent (an option that is not in effect).
    must_dedupe: bool = False
    #: A baseline for new keys only: no duplicates timed, not raced.
    new_only: bool = False


def real(task: Any) -> Any:
    """The task behind ``app.task``'s lazy proxy (no proxy lookup per call)."""
    get = getattr(task, "_get_current_object", None)
    return get() if get is not None else task


def publisher(task: Any) -> Callable[[str], Any]:
    """``key -> task.apply_async((key,))``, the call every contender is timed by."""
    send = real(task).apply_async
    return lambda key: send((key,))


def _ours(app: Any, lock_url: str) -> tuple[Optional[Contender], str]:
    """celery_redislock's unique jobs, or why they could not be set up."""
    try:
        from celery_redislock import AlreadyQueued, LockedTask
        from celery_redislock.config import client_for
    except ImportError as exc:
        return None, f"celery_redislock has no unique jobs here ({exc})"
    try:

        @app.task(
            name="bench.unique.ours",
            base=LockedTask,
            lock_key=["key"],
            unique="until_finished",
            shared=False,
        )
        def ours(key: str) -> str:
            return key

        client = instrument(client_for(app), "celery_redislock")
    except Exception as exc:
        return None, f"celery_redislock: setting up a unique task failed: {exc!r}"

    task = real(ours)

    def publish_raise(key: str) -> Any:
        return task.apply_async((key,), redislock={"on_duplicate": "raise"})

    c = Contender(
        'celery_redislock, unique="until_finished"',
        publisher(task),
        [client],
        note="one Lua script per call (the API's promise); a duplicate returns the "
        "first task's AsyncResult",
        duplicate_errors=(AlreadyQueued,),
        must_dedupe=True,
    )
    c.publish_raise = publish_raise  # type: ignore[attr-defined]
    return c, ""


def _shims(app: Any) -> tuple[list[Contender], str]:
    """celery_redislock.compat's QueueOnce and Singleton (one changed import),
    configured as the two originals below are; or why they could not be set up."""
    try:
        from celery_redislock.compat import AlreadyQueued, DuplicateTaskError, QueueOnce, Singleton
        from celery_redislock.config import client_for
    except ImportError as exc:
        return [], f"celery_redislock has no compat shims here ({exc})"

    @app.task(name="bench.unique.shim_once", base=QueueOnce, shared=False)
    def shim_once(key: str) -> str:
        return key

    @app.task(name="bench.unique.shim_singleton", base=Singleton, shared=False)
    def shim_singleton(key: str) -> str:
        return key

    client = instrument(client_for(app), "celery_redislock")
    return [
        Contender(
            "celery_redislock.compat QueueOnce",
            publisher(shim_once),
            [client],
            note="the shim: LockedTask with unique='until_finished', on_duplicate='raise', "
            "the key's deadline in a header; a duplicate raises the shim's AlreadyQueued",
            duplicate_errors=(AlreadyQueued,),
        ),
        Contender(
            "celery_redislock.compat Singleton",
            publisher(shim_singleton),
            [client],
            note="the shim: LockedTask with unique='until_finished'; a duplicate returns "
            "the first task's AsyncResult",
            duplicate_errors=(DuplicateTaskError,),
        ),
    ], ""


def _celery_once(app: Any, lock_url: str) -> Contender:
    import celery_once.backends.redis as once_redis
    from celery_once import AlreadyQueued, QueueOnce

    @app.task(name="bench.unique.once", base=QueueOnce, shared=False)
    def once(key: str) -> str:
        return key

    # Its backend keeps one StrictRedis per process in a module global.
    client = instrument(once_redis.get_redis(app.conf.ONCE["settings"]), "celery-once")
    return Contender(
        "celery-once (QueueOnce)",
        publisher(once),
        [client],
        note="redis-py Lock.acquire: SET NX PX; a duplicate then reads PTTL and raises "
        "AlreadyQueued (with once={'graceful': True}: returns EagerResult(None), no id)",
        duplicate_errors=(AlreadyQueued,),
    )


def _celery_singleton(app: Any, lock_url: str) -> Contender:
    from celery_singleton import DuplicateTaskError, Singleton

    @app.task(name="bench.unique.singleton", base=Singleton, shared=False)
    def singleton(key: str) -> str:
        return key

    client = instrument(singleton.singleton_backend.redis, "celery-singleton")
    return Contender(
        "celery-singleton (Singleton)",
        publisher(singleton),
        [client],
        note="SET NX (no expiry unless singleton_lock_expiry is set); a duplicate then "
        "GETs the first task's id and returns its AsyncResult (it loops while the GET "
        "finds nothing)",
        duplicate_errors=(DuplicateTaskError,),
    )


def _heimdall(app: Any, lock_url: str, blocking: bool) -> Contender:
    from celery_heimdall import AlreadyQueuedError, HeimdallTask

    class BenchHeimdall(HeimdallTask):  # type: ignore[misc]
        """Its documented way to choose the store: override setup_redis."""

        abstract = True

        def setup_redis(self) -> redis.Redis:
            return redis.Redis.from_url(lock_url)

    options: dict[str, Any] = {"unique": True}
    if not blocking:
        options["unique_lock_blocking"] = False
    suffix = "" if blocking else "_nb"

    @app.task(
        name=f"bench.unique.heimdall{suffix}", base=BenchHeimdall, heimdall=options, shared=False
    )
    def heimdall(key: str) -> str:
        return key

    mode = "defaults: blocking 1 s" if blocking else "non-blocking"
    label = f"celery-heimdall (unique, {mode})"
    client = instrument(heimdall.heimdall_redis, label)
    note = (
        "redis-py Lock.acquire(token=task id): SET NX PX; a duplicate then reads GET + TTL "
        "in one pipeline and returns the holder's AsyncResult"
    )
    if blocking:
        note += "; with its defaults the duplicate first retries the SET every 0.1 s for 1 s"
    return Contender(
        label,
        publisher(heimdall),
        [client],
        slow_dup=blocking,
        note=note,
        duplicate_errors=(AlreadyQueuedError,),
    )


def _celery_once_task(app: Any, lock_url: str) -> Contender:
    import celery_once_task
    import celery_once_task.utils as once_task_utils
    from celery_once_task import OnceTask

    celery_once_task.configure(redis_url=lock_url)
    once_task_utils.reset_redis()

    @app.task(name="bench.unique.once_task", base=OnceTask, shared=False)
    def once_task(key: str) -> str:
        return key

    # One redis-py client per process in a module global.
    client = instrument(once_task_utils.get_redis(), "celery-once-task")
    return Contender(
        "celery-once-task (OnceTask)",
        publisher(once_task),
        [client],
        note="SET NX EX (a queue lock, 3600 s); a duplicate returns None (no id); "
        "Redis errors count as 'already queued' (the SET's exception is swallowed)",
    )


class ReferenceUnique:
    """The least a unique publish that hands every caller the first id can do: one
    ``SET key id NX PX ttl GET`` (Redis 7.0+), then the send if the key was free."""

    def __init__(self, app: Any, lock_url: str) -> None:
        from celery import Task
        from kombu.utils.uuid import uuid

        store = instrument(redis.Redis.from_url(lock_url), "reference")
        self.client = store

        class Reference(Task):  # type: ignore[misc]
            abstract = True

            def apply_async(
                self, args: Any = None, kwargs: Any = None, task_id: Any = None, **options: Any
            ) -> Any:
                task_id = task_id or uuid()
                key = f"bench:ref:{self.name}:{args[0]}"
                first = store.set(key, task_id, nx=True, px=TTL_S * 1000, get=True)
                if first is not None:
                    return self.AsyncResult(first.decode())
                return super().apply_async(args, kwargs, task_id=task_id, **options)

        @app.task(name="bench.unique.reference", base=Reference, shared=False)
        def reference(key: str) -> str:
            return key

        self.task = reference

    def contender(self) -> Contender:
        return Contender(
            "reference: SET NX PX GET, then the send",
            publisher(self.task),
            [self.client],
            note="written here: one SET ... NX PX ... GET; the first caller sends, every "
            "other gets the first id back",
        )


def _plain(app: Any, lock_url: str) -> Contender:
    @app.task(name="bench.unique.plain", shared=False)
    def plain(key: str) -> str:
        return key

    return Contender(
        "plain Celery (no deduplication)",
        publisher(plain),
        [],
        note="Celery's apply_async alone: the broker send every row above pays for a new key",
    )


def _set_nx_send(app: Any, lock_url: str) -> Contender:
    from celery import Task

    client = instrument(redis.Redis.from_url(lock_url), "SET NX, then the send")
    value = "x" * 36
    px = TTL_S * 1000

    class SetNxThenSend(Task):  # type: ignore[misc]
        abstract = True

        def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
            client.set(f"bench:setnx-send:{args[0]}", value, nx=True, px=px)
            return super().apply_async(args, kwargs, **options)

    @app.task(name="bench.unique.setnx_send", base=SetNxThenSend, shared=False)
    def setnx_send(key: str) -> str:
        return key

    return Contender(
        SEND_BASELINE,
        publisher(setnx_send),
        [client],
        new_only=True,
        note="the same bare SET NX PX, made right before Celery's send: the unit of a new "
        "key's store step, measured where a contender's is (after a send, its caches cold)",
    )


EVAL_SET_NX_OR_GET = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return redis.call('GET', KEYS[1])
"""


def _set_nx(lock_url: str) -> Contender:
    client = instrument(redis.Redis.from_url(lock_url), "SET NX")
    value = "x" * 36  # a task id's length
    px = TTL_S * 1000
    return Contender(
        "baseline: bare SET NX PX (redis-py)",
        lambda key: client.set(f"bench:setnx:{key}", value, nx=True, px=px),
        [client],
        celery=False,
        note="client.set(key, value, nx=True, px=ttl): the store step's unit",
    )


def _eval_set_nx(lock_url: str) -> Contender:
    client = instrument(redis.Redis.from_url(lock_url), "EVALSHA")
    sha = client.script_load(EVAL_SET_NX_OR_GET)
    value = "x" * 36
    px = TTL_S * 1000
    return Contender(
        "baseline: EVALSHA (SET NX PX, else GET)",
        lambda key: client.evalsha(sha, 1, f"bench:eval:{key}", value, px),
        [client],
        celery=False,
        note="the same as one script through redis-py's evalsha: the price of Lua itself",
    )


def make_app(port: int) -> Any:
    from celery import Celery

    lock_url = f"redis://127.0.0.1:{port}/{LOCK_DB}"
    app = Celery("redislock_bench_unique", broker=f"redis://127.0.0.1:{port}/{BROKER_DB}")
    app.conf.update(
        broker_connection_retry_on_startup=True,
        task_default_queue=QUEUE,
        redislock_url=lock_url,
        # celery-once's documented configuration.
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": lock_url, "default_timeout": TTL_S},
        },
        # celery-singleton: the result backend's or the broker's db otherwise.
        singleton_backend_url=lock_url,
    )
    return app


def contenders(app: Any) -> tuple[list[Contender], list[str]]:
    lock_url = app.conf.redislock_url
    notes = []
    rows: list[Contender] = []
    ours, why = _ours(app, lock_url)
    if ours is None:
        notes.append(why)
    else:
        rows.append(ours)
    shims, why = _shims(app)
    if why:
        notes.append(why)
    rows += shims
    rows += [
        _celery_once(app, lock_url),
        _celery_singleton(app, lock_url),
        _heimdall(app, lock_url, blocking=False),
        _heimdall(app, lock_url, blocking=True),
        _celery_once_task(app, lock_url),
        ReferenceUnique(app, lock_url).contender(),
        _plain(app, lock_url),
        _set_nx_send(app, lock_url),
        _set_nx(lock_url),
        _eval_set_nx(lock_url),
    ]
    app.finalize()
    return rows, notes


BASELINE = "baseline: bare SET NX PX (redis-py)"
SEND_BASELINE = "baseline: bare SET NX PX, then the send"


# -- the broker's queue ----------------------------------------------------------------


class Queue:
    """The broker's queue on db 1: kombu's Redis transport keeps a list per priority
    step (``celery``, ``celery\\x06\\x163``...)."""

    def __init__(self, port: int) -> None:
        self.client = redis.Redis(host="127.0.0.1", port=port, db=BROKER_DB)

    def keys(self) -> list[bytes]:
        return [
            k for k in self.client.scan_iter(match=f"{QUEUE}*") if self.client.type(k) == b"list"
        ]

    def length(self) -> int:
        return sum(self.client.llen(k) for k in self.keys())

    def purge(self) -> None:
        keys = self.keys()
        if keys:
            self.client.delete(*keys)

    def messages(self) -> list[tuple[str, str]]:
        """(first argument, task id) of every queued message."""
        out = []
        for k in self.keys():
            for raw in self.client.lrange(k, 0, -1):
                m = json.loads(raw)
                body = m["body"]
                if m.get("properties", {}).get("body_encoding") == "base64":
                    body = base64.b64decode(body)
                args = json.loads(body)[0]
                out.append((str(args[0]), m["headers"]["id"]))
        return out


# -- per contender results -------------------------------------------------------------


@dataclass
class Result:
    c: Contender
    failed: str = ""
    #: Round trips per call, new key and duplicate, and the commands.
    trips_new: float = 0.0
    trips_dup: float = 0.0
    commands_new: str = ""
    commands_dup: str = ""
    #: Round trips sent while inside Celery's own Task.apply_async (not isolable then).
    trips_inside_send: int = 0
    #: Requests the server saw on the store's db per call (MONITOR), and what scripts ran.
    server_new: float = 0.0
    server_dup: float = 0.0
    script_commands: str = ""
    #: Whole call and store step, seconds.
    new: list[float] = field(default_factory=list)
    new_store: list[float] = field(default_factory=list)
    dup: list[float] = field(default_factory=list)
    #: Per batch: (median store step new, median dup, median whole new).
    batch: list[tuple[float, float, float]] = field(default_factory=list)
    dup_calls: int = 0
    dup_messages: int = 0
    #: Outcome of a duplicate ("id", "None", an exception name...).
    dup_outcome: str = ""
    #: Race summaries per mode ("threads", "processes").
    race: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    #: What one new job leaves in the store: how many keys, their TTLs.
    store_keys: str = ""
    #: Redis's own time per call for the store's commands, µs (SLOWLOG).
    server_us_new: float = 0.0
    server_us_dup: float = 0.0


def call(c: Contender, key: str) -> Any:
    """Publish; the peer's "already queued" exception is returned, not raised."""
    try:
        return c.publish(key)
    except c.duplicate_errors as exc:
        return exc


def outcome(value: Any) -> tuple[str, Optional[str]]:
    """("id", task id) / ("none", None) / ("raised", exception name) / ("value", repr)."""
    if isinstance(value, BaseException):
        return "raised", type(value).__name__
    if value is None:
        return "none", None
    task_id = getattr(value, "id", None)
    if task_id is None and hasattr(value, "id"):
        return "none", None  # celery-once's graceful EagerResult(None)
    if task_id is None:
        return "value", repr(value)[:40]
    return "id", str(task_id)


def describe_outcome(value: Any) -> str:
    kind, what = outcome(value)
    return {"id": "an AsyncResult", "none": "None", "raised": f"raises {what}"}.get(kind, f"{what}")


def summarize_commands(sends: list[tuple[str, tuple[str, ...], bool]], calls: int) -> str:
    counts = Counter("+".join(names) for _, names, _ in sends)
    return (
        ", ".join(
            name if n == calls else f"{name} x{n / calls:g}" for name, n in counts.most_common()
        )
        or "-"
    )


class Monitor:
    """MONITOR in a thread: requests to the store's db (not from scripts), and the
    commands scripts ran, until ``stop()``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop_token = f"bench-stop-{os.urandom(4).hex()}"
        self.requests: Counter[str] = Counter()
        self.scripts: Counter[str] = Counter()
        self.monitor_client = redis.Redis(host="127.0.0.1", port=port)
        self.admin = redis.Redis(host="127.0.0.1", port=port, db=LOCK_DB)
        self.admin.ping()  # its connection's handshake, before MONITOR starts
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _run(self) -> None:
        with self.monitor_client.monitor() as m:
            self.ready.set()
            while True:
                cmd = m.next_command()
                text = cmd["command"]
                if self.stop_token in text:
                    return
                if int(cmd.get("db", -1)) != LOCK_DB:
                    continue
                name = text.split(" ", 1)[0].upper()
                if cmd.get("client_type") == "lua":
                    self.scripts[name] += 1
                else:
                    self.requests[name] += 1

    def stop(self) -> None:
        self.admin.echo(self.stop_token)
        self.thread.join(10)
        self.admin.close()
        self.monitor_client.close()


class SlowLog:
    """Redis's own time for the commands of a stretch (SLOWLOG with no threshold)."""

    def __init__(self, port: int) -> None:
        self.client = redis.Redis(host="127.0.0.1", port=port, db=LOCK_DB)
        self.client.config_set("slowlog-max-len", 100000)
        self.client.config_set("slowlog-log-slower-than", 0)
        self.client.slowlog_reset()
        self.entries: list[Any] = []

    def stop(self) -> None:
        self.client.config_set("slowlog-log-slower-than", 10000)
        self.entries = self.client.slowlog_get(100000)
        self.client.close()

    def usec(self, names: set[str]) -> float:
        """µs spent in commands named ``names`` (not on the broker's keys)."""
        total = 0
        for e in self.entries:
            args = e["command"].split(b" ") if isinstance(e["command"], bytes) else []
            if not args or args[0].decode().upper() not in names:
                continue
            key = args[1] if len(args) > 1 else b""
            if key.startswith((QUEUE.encode(), b"_kombu")):
                continue
            total += e["duration"]
        return float(total)


def count_pass(r: Result, port: int, queue: Queue, tag: str) -> None:
    """Warm up, then count round trips (client side) and requests (server side)."""
    c = r.c
    queue.purge()
    store = redis.Redis(host="127.0.0.1", port=port, db=LOCK_DB)
    before = set(store.scan_iter(count=1000))
    call(c, f"{tag}:probe")
    left = sorted(set(store.scan_iter(count=1000)) - before)
    ttls = [store.pttl(k) for k in left]
    store.close()
    r.store_keys = f"{len(left)} key(s)" + (
        " (" + ", ".join(f"TTL {t / 1000:.0f} s" if t >= 0 else "no expiry" for t in ttls) + ")"
        if left
        else ""
    )
    call(c, f"{tag}:probe")
    if c.must_dedupe and queue.length() > 1:
        raise RuntimeError("a duplicate was sent: unique jobs are not in effect here")
    dups = SLOW_DUPS // 2 if c.slow_dup else COUNTED
    warm_dups = 1 if c.slow_dup else WARMUP
    for i in range(WARMUP):
        call(c, f"{tag}:warm:{i}")
    for _ in range(warm_dups):
        call(c, f"{tag}:warm:0")
    counted = []
    for phase, keys, again in (
        (
            "new",
            [f"{tag}:new:{i}" for i in range(COUNTED)],
            [f"{tag}:new2:{i}" for i in range(COUNTED)],
        ),
        ("dup", [] if c.new_only else [f"{tag}:warm:1"] * dups, [f"{tag}:warm:1"] * dups),
    ):
        if not keys:
            continue
        monitor = Monitor(port)
        Recorder.start()
        try:
            for key in keys:
                last = call(c, key)
        finally:
            sends = Recorder.stop()
            monitor.stop()
        counted.append((phase, sends, len(keys), monitor, last))
        # Redis's time in a pass of its own: MONITOR slows a script's every call down.
        slowlog = SlowLog(port)
        try:
            for key in again:
                call(c, key)
        finally:
            slowlog.stop()
        names = {name for _, sent_names, _ in sends for name in sent_names}
        usec = slowlog.usec(names) / len(again)
        if phase == "new":
            r.server_us_new = usec
        else:
            r.server_us_dup = usec
    for phase, sends, calls, monitor, last in counted:
        trips = len(sends) / calls
        sent = sum(len(names) for _, names, _ in sends) / calls
        commands = summarize_commands(sends, calls)
        server = sum(monitor.requests.values()) / calls
        if phase == "new":
            r.trips_new, r.commands_new, r.server_new = trips, commands, server
            r.trips_inside_send = sum(1 for _, _, inside in sends if inside)
            r.script_commands = ", ".join(
                f"{n} x{k / calls:g}" for n, k in monitor.scripts.most_common()
            )
        else:
            r.trips_dup, r.commands_dup, r.server_dup = trips, commands, server
            r.dup_outcome = describe_outcome(last)
        if server != sent:
            r.extra.append(
                f"{phase}: the server saw {server:g} commands per call on the store's db "
                f"({dict(monitor.requests)}), the counted clients sent {sent:g}"
            )
    publish_raise = getattr(c, "publish_raise", None)
    if publish_raise is not None:  # ours: on_duplicate="raise" per call
        r.extra.append('on_duplicate="raise" per call: ' + check_raise(c, publish_raise, tag))
    queue.purge()


def check_raise(c: Contender, publish_raise: Callable[[str], Any], tag: str) -> str:
    """What a duplicate published with ``on_duplicate="raise"`` got."""
    first = c.publish(f"{tag}:raise")
    try:
        got = publish_raise(f"{tag}:raise")
    except c.duplicate_errors as exc:
        task_id = getattr(exc, "task_id", None)
        same = "the first id" if task_id == getattr(first, "id", "?") else repr(task_id)
        return f"{type(exc).__name__}(key={getattr(exc, 'key', '?')!r}, task_id={same})"
    except Exception as exc:
        return f"FAILED, {exc!r}"[:200]
    return f"returned {got!r} instead of raising"


# -- timed batches ----------------------------------------------------------------------


def timed(c: Contender, key: str) -> tuple[float, float, int]:
    """(whole call, time inside Celery's Task.apply_async, messages built) of one publish."""
    _tls.send = 0.0
    _tls.sends = 0
    t0 = now()
    try:  # noqa: SIM105 - not contextlib.suppress: no context manager inside the timing
        c.publish(key)
    except c.duplicate_errors:
        pass
    whole = now() - t0
    return whole, _tls.send, _tls.sends


def run_batch(r: Result, queue: Queue, tag: str, new: int, dups: int) -> None:
    c = r.c
    if c.celery:
        queue.purge()
    store_new, dup_times = [], []
    for i in range(new):
        whole, send, _ = timed(c, f"{tag}:{i}")
        r.new.append(whole)
        store_new.append(whole - send)
    if dups:
        key = f"{tag}:dup"
        call(c, key)
        before = queue.length() if c.celery else 0
        for _ in range(dups):
            whole, _, _ = timed(c, key)
            dup_times.append(whole)
        if c.celery:
            r.dup_messages += queue.length() - before
        r.dup_calls += dups
        r.dup += dup_times
    r.new_store += store_new
    r.batch.append(
        (
            statistics.median(store_new) if store_new else float("nan"),
            statistics.median(dup_times) if dup_times else float("nan"),
            statistics.median(r.new[-new:]) if new else float("nan"),
        )
    )
    if c.celery:
        queue.purge()


# -- 50 producers at once ------------------------------------------------------------------


#: A race plan: every producer publishes these keys of these contenders, in order,
#: each key right after a barrier all producers wait at.
Plan = list[tuple[Contender, list[str]]]


def producer(plan: Plan, barrier: Any) -> list[tuple[str, Any, float, float]]:
    """Publish each key right after the barrier opens: (key, outcome, start, end)."""
    out = []
    for c, keys in plan:
        for key in keys:
            barrier.wait(120)
            t0 = now()
            try:
                value = outcome(call(c, key))
            except Exception as exc:
                value = ("error", f"{type(exc).__name__}: {exc}"[:80])
            out.append((key, value, t0, now()))
    return out


def race_threads(plan: Plan, producers: int, timeout: float) -> list[Any]:
    barrier = threading.Barrier(producers)
    results: list[Any] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            got = producer(plan, barrier)
        except threading.BrokenBarrierError:
            log(f"warning: a producer thread gave up:\n{traceback.format_exc()}")
            return
        with lock:
            results.extend(got)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(producers)]
    for t in threads:
        t.start()
    deadline = now() + timeout
    for t in threads:
        t.join(max(0.1, deadline - now()))
    if any(t.is_alive() for t in threads):
        barrier.abort()
        log("warning: producer threads still running at the deadline; their calls are left out")
    with lock:
        return list(results)


def _child(plan: Plan, barrier: Any, send: Any) -> None:
    try:
        send.send(producer(plan, barrier))
    except Exception:
        send.send(("failed", traceback.format_exc()))
    send.close()


def race_processes(plan: Plan, producers: int, timeout: float) -> list[Any]:
    """Forked once for every contender of the plan (a fork of this process costs
    tens of ms on a small machine)."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(producers)
    procs, ends = [], []
    for _ in range(producers):
        receive, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(plan, barrier, send), daemon=True)
        p.start()
        send.close()
        procs.append(p)
        ends.append(receive)
    results: list[Any] = []
    deadline = now() + timeout
    for receive in ends:
        if receive.poll(max(0.1, deadline - now())):
            with contextlib.suppress(EOFError):
                got = receive.recv()
                if isinstance(got, tuple) and got and got[0] == "failed":
                    log(f"warning: a producer process failed:\n{got[1]}")
                else:
                    results.extend(got)
    for p in procs:
        p.join(max(0.1, deadline - now()))
        if p.is_alive():
            log(f"warning: producer process {p.pid} stuck, terminating it")
            p.terminate()
            p.join()
    return results


def race(rows: list[Result], queue: Queue, mode: str, keys: int, producers: int) -> None:
    """Every producer publishes each key of every row at once (one warm-up key per
    row first: connections); then what was queued per key, and what each caller got."""
    plan: Plan = []
    names: dict[int, list[str]] = {}
    for i, r in enumerate(rows):
        n = min(keys, SLOW_RACE_KEYS) if r.c.slow_dup else keys
        names[i] = [f"race:{mode}:{i}:{k}" for k in range(n)]
        plan.append((r.c, [f"race:{mode}:{i}:warm", *names[i]]))
    rounds = sum(len(k) for _, k in plan)
    queue.purge()
    run = race_threads if mode == "threads" else race_processes
    calls = run(plan, producers, 60 + 3 * rounds)
    queued: dict[str, list[str]] = {}
    for key, task_id in queue.messages():
        queued.setdefault(key, []).append(task_id)
    queue.purge()
    by_key: dict[str, list[Any]] = {}
    for x in calls:
        by_key.setdefault(x[0], []).append(x)
    for i, r in enumerate(rows):
        r.race[mode] = summarize_race(names[i], by_key, queued)


def summarize_race(
    names: list[str], by_key: dict[str, list[Any]], queued: dict[str, list[str]]
) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    overlaps, spreads = [], []
    for key in names:
        mine = by_key.get(key, [])
        if not mine:
            continue
        overlaps.append(peak_overlap([(t0, t1) for _, _, t0, t1 in mine]))
        starts = [t0 for _, _, t0, _ in mine]
        spreads.append(max(starts) - min(starts))
        ids = set(queued.get(key, []))
        for _, (kind, what), _, _ in mine:
            if kind == "id" and what in ids:
                kinds["queued id" if len(ids) == 1 else "its own message's id"] += 1
            elif kind == "id":
                kinds["an id no queued message has"] += 1
            elif kind == "raised":
                kinds[f"raised {what}"] += 1
            else:
                kinds[kind if kind != "error" else f"error {what}"] += 1
    per_key = [len(queued.get(k, [])) for k in names]
    return {
        "keys": len(names),
        "calls": sum(len(by_key.get(k, [])) for k in names),
        "max": max(per_key) if per_key else 0,
        "mean": statistics.mean(per_key) if per_key else 0.0,
        "over_one": sum(1 for n in per_key if n > 1),
        "none": sum(1 for n in per_key if n == 0),
        "kinds": kinds,
        "overlap": statistics.median(overlaps) if overlaps else 0,
        "spread": statistics.median(spreads) if spreads else 0.0,
    }


# -- report --------------------------------------------------------------------------------


def us(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e6:.0f}" if values else "-"


def batch_ratio(r: Result, i: int, base: Result, j: int) -> Optional[float]:
    """Median over batches of r's batch median ``i`` over base's batch median ``j``
    (both from the same batch, back to back: the machine's drift cancels)."""
    ratios = [a[i] / b[j] for a, b in zip(r.batch, base.batch) if b[j] > 0 and a[i] == a[i]]
    return statistics.median(ratios) if ratios else None


def times(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value < 100 else f"{value:.0f}x"


def ratio_cell(r: Result, bare: Result, in_context: Result) -> str:
    """A new key's store step against the bare SET NX made right before a send, a
    duplicate against the bare SET NX of a held key; for a contender with no store,
    its whole publish against the bare SET NX."""
    if r.c.celery and not r.c.clients:
        return f"whole publish {times(batch_ratio(r, 2, bare, 0))}"
    new = batch_ratio(r, 0, in_context, 0)
    dup = None if r.c.new_only else batch_ratio(r, 1, bare, 1)
    return f"{times(new)} / {times(dup)}"


def same_id_cell(race: dict[str, dict[str, Any]]) -> str:
    kinds: Counter[str] = Counter()
    for summary in race.values():
        kinds.update(summary["kinds"])
    if not kinds:
        return "-"
    total = sum(kinds.values())
    firsts = sum(s["keys"] for s in race.values())  # one message per key and mode at best
    others = [k for k in kinds if k != "queued id"]
    if not others:
        return "yes"
    if kinds["queued id"] == firsts and all(k == "none" or k.startswith("raised") for k in others):
        got = " or ".join(
            "get None" if k == "none" else f"raise {k.split(' ', 1)[1]}" for k in others
        )
        verdict = "no: " if "none" in others else ""
        return f"{verdict}the first caller gets the id, the others {got}"
    return "no: " + ", ".join(f"{n}/{total} {kind}" for kind, n in kinds.most_common())


def messages_cell(race: dict[str, dict[str, Any]], modes: list[str]) -> str:
    cells = []
    for mode in modes:
        s = race.get(mode)
        cells.append("-" if s is None else f"{s['max']}")
    return " / ".join(cells)


RATIOS = (
    "Ratios: the median, over batches, of the ratio of two medians of the same batch. "
    "A new key's store step is its whole apply_async minus the time inside Celery's own "
    "Task.apply_async (the message and the broker send), against the bare SET NX PX made "
    "right before the same send (row 'bare SET NX PX, then the send'); a duplicate, which "
    "sends nothing, is its whole call against a bare SET NX PX of a held key, back to back."
)


def table(results: list[Result], modes: list[str]) -> str:
    bare = next(r for r in results if r.c.label == BASELINE)
    in_context = next(r for r in results if r.c.label == SEND_BASELINE)
    lines = [
        "| contender | round trips new / dup | µs per publish new / dup "
        "| store step / bare SET NX, new / dup "
        f"| messages per key under producers ({' / '.join(modes) or 'not raced'}, max) "
        "| messages per duplicate | same id to every caller |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if r.failed:
            lines.append(f"| {r.c.label} | failed: {r.failed} | | | | | |")
            continue
        per_dup = f"{r.dup_messages / r.dup_calls:g}" if r.c.celery and r.dup_calls else "-"
        trips_dup = "-" if r.c.new_only else f"{r.trips_dup:g}"
        messages = messages_cell(r.race, modes) if r.race else "-"
        same = same_id_cell(r.race) if r.race else "-"
        lines.append(
            f"| {r.c.label} | {r.trips_new:g} / {trips_dup} | {us(r.new)} / {us(r.dup)} "
            f"| {ratio_cell(r, bare, in_context)} | {messages} | {per_dup} | {same} |"
        )
    return "\n".join(lines)


def details(results: list[Result], modes: list[str]) -> str:
    lines = ["Per publish (counted after a warm-up; commands client-side, per call):", ""]
    for r in results:
        if r.failed:
            continue
        line = (
            f"- {r.c.label}: new key {r.commands_new}; duplicate {r.commands_dup}"
            f" ({r.dup_outcome or '-'})"
        )
        if r.server_us_new or r.server_us_dup:
            line += (
                f"; Redis's own time per call {r.server_us_new:.1f} / {r.server_us_dup:.1f} µs "
                "(new / dup, SLOWLOG)"
            )
        if r.store_keys:
            line += f"; a new job leaves {r.store_keys} in the store"
        if r.script_commands:
            line += f"; inside scripts, per new key: {r.script_commands}"
        if r.c.celery:
            line += (
                f"; store step of a new key {us(r.new_store)} µs of {us(r.new)} "
                f"(range of batch medians {min(b[0] for b in r.batch) * 1e6:.0f}-"
                f"{max(b[0] for b in r.batch) * 1e6:.0f})"
            )
        if r.trips_inside_send:
            line += (
                f"; {r.trips_inside_send} store round trips came from inside Celery's "
                "Task.apply_async: its store step is not separated from the send"
            )
        lines.append(line)
        lines += [f"  - {x}" for x in r.extra]
        if r.c.note:
            lines.append(f"  - {r.c.note}")
    lines += ["", "Producers publishing the same key at once:", ""]
    lines.append(
        "| contender | mode | keys | calls | messages per key max / mean | keys with more than one "
        "| keys with none | callers got | peak callers in flight (median) "
        "| start spread (median, ms) |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in results:
        for mode in modes:
            s = r.race.get(mode)
            if s is None:
                continue
            got = ", ".join(f"{n} {kind}" for kind, n in s["kinds"].most_common())
            lines.append(
                f"| {r.c.label} | {mode} | {s['keys']} | {s['calls']} | {s['max']} / "
                f"{s['mean']:.2f} | {s['over_one']} | {s['none']} | {got} | {s['overlap']:g} "
                f"| {s['spread'] * 1000:.1f} |"
            )
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------


def versions() -> str:
    out = []
    for d in (
        "celery",
        "kombu",
        "redis",
        "hiredis",
        "celery-redislock",
        "celery_once",
        "celery-singleton",
        "celery-heimdall",
        "celery-once-task",
    ):
        try:
            out.append(f"{d} {version(d)}")
        except PackageNotFoundError:
            out.append(f"{d} -")
    import celery_redislock

    out.append(f"celery_redislock from {os.path.dirname(celery_redislock.__file__)}")
    return ", ".join(out)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--publishes", type=int, default=1000, help="timed publishes per contender, of each kind"
    )
    parser.add_argument("--batches", type=int, default=20, help="interleaved batches (default 20)")
    parser.add_argument("--producers", type=int, default=50, help="concurrent producers (50)")
    parser.add_argument(
        "--race-keys", type=int, default=20, help="keys raced per contender and mode (20)"
    )
    parser.add_argument(
        "--race",
        choices=("threads", "processes", "both", "none"),
        default="both",
        help="producers as threads, forked processes, both (default) or no race",
    )
    args = parser.parse_args(argv)
    if args.publishes < args.batches or args.batches < 1 or args.producers < 2:
        parser.error("--publishes at least --batches, --batches positive, --producers >= 2")
    modes = {"both": ["threads", "processes"], "none": []}.get(args.race, [args.race])

    started = now()
    server = private_server()
    try:
        admin = redis.Redis(host="127.0.0.1", port=server.port)
        log(
            f"redis-server {admin.info('server')['redis_version']} on 127.0.0.1:{server.port}; "
            f"Python {platform.python_version()}; {versions()}; {os.cpu_count()} CPUs; "
            f"load {'/'.join(f'{x:.1f}' for x in os.getloadavg())}"
        )
        app = make_app(server.port)
        patch_celery_send()
        rows, notes = contenders(app)
        for note in notes:
            log(f"note: {note}")
        queue = Queue(server.port)
        results = [Result(c) for c in rows]
        for i, r in enumerate(results):
            try:
                count_pass(r, server.port, queue, f"count:{i}")
            except Exception as exc:
                r.failed = f"{type(exc).__name__}: {exc}"[:120]
                log(f"warning: {r.c.label} failed in the counting pass:\n{traceback.format_exc()}")
        log(f"  counted round trips: {now() - started:.1f} s")

        news = split(args.publishes, args.batches)
        dups = split(args.publishes, args.batches)
        slow_dups = split(SLOW_DUPS, args.batches)
        for b in range(args.batches):
            t = now()
            k = b % len(results)
            for r in results[k:] + results[:k]:
                if r.failed:
                    continue
                try:
                    n_dups = 0 if r.c.new_only else slow_dups[b] if r.c.slow_dup else dups[b]
                    run_batch(r, queue, f"time:{results.index(r)}:{b}", news[b], n_dups)
                except Exception as exc:
                    r.failed = f"{type(exc).__name__}: {exc}"[:120]
                    log(f"warning: {r.c.label} failed:\n{traceback.format_exc()}")
            log(f"  batch {b + 1}/{args.batches}: {now() - t:.1f} s")

        racing = [r for r in results if not r.failed and r.c.celery and not r.c.new_only]
        for mode in modes:
            t = now()
            try:
                race(racing, queue, mode, args.race_keys, args.producers)
            except Exception:
                log(f"warning: the {mode} race failed:\n{traceback.format_exc()}")
            log(f"  race, {args.producers} {mode}: {now() - t:.1f} s")

        print(table(results, modes))
        print()
        print(RATIOS)
        print()
        print(details(results, modes))
        for note in notes:
            print(f"\nNot measured: {note}")
        log(f"total {now() - started:.1f} s")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
