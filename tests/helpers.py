"""Test helpers shared by the test modules: round trips, waiting, processes, intervals.

``counting_client(url)`` gives a ``redis.Redis`` whose every round trip (one
``send_packed_command`` call: a single command, or a whole pipeline) is recorded
with the commands it carried, so tests can assert "one round trip" as a fact
rather than infer it from timings.  ``TcpProxy`` sits between a client and a
redis-server and can swallow traffic without closing sockets: a network
partition, as opposed to a server that refuses connections.

Recorded intervals (a body's or a critical section's start and end) come from
time.monotonic(), which on Linux is CLOCK_MONOTONIC and so comparable across
the processes of one machine (workers, forked children and the test process).
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import signal
import socket
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import redis

from celery_redislock.primitives import scripts

__all__ = [
    "Attempt",
    "Command",
    "CountingConnection",
    "Interval",
    "RoundTrips",
    "TcpProxy",
    "assert_no_overlap",
    "assert_rising",
    "blocked_clients",
    "counting_client",
    "fork_context",
    "forking",
    "intervals",
    "keys_of",
    "kill_now",
    "outputs",
    "overlapping",
    "parse_commands",
    "peak_overlap",
    "race",
    "report",
    "running",
    "server_ms",
    "sha",
    "utilisation",
    "wait_until",
]

Command = tuple[bytes, ...]
#: What redis-py sends when it opens a connection, before any command.
HANDSHAKE = frozenset({"HELLO", "CLIENT", "AUTH", "SELECT", "READONLY", "PING"})
Interval = tuple[float, float]


def parse_commands(packed: bytes) -> list[Command]:
    """Split RESP-encoded requests (``*N`` arrays of ``$len`` bulk strings) into commands."""
    commands: list[Command] = []
    i = 0
    while i < len(packed):
        if packed[i : i + 1] != b"*":
            raise ValueError(f"not a RESP array at offset {i}: {packed[i : i + 20]!r}")
        j = packed.index(b"\r\n", i)
        count, i = int(packed[i + 1 : j]), j + 2
        args = []
        for _ in range(count):
            j = packed.index(b"\r\n", i)
            length, i = int(packed[i + 1 : j]), j + 2
            args.append(bytes(packed[i : i + length]))
            i += length + 2
        commands.append(tuple(args))
    return commands


class RoundTrips:
    """What a client sent, one entry per round trip, each a list of commands.

    A command is a tuple of its arguments as bytes, name first (``b"EVALSHA"``).
    ``before_send``, when set, is called with the commands of a round trip just
    before they go out, in the sending thread: a test can use it to hold one
    thread at a precise point (it changes no data).  Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sends: list[list[Command]] = []
        self.before_send: Optional[Callable[[list[Command]], None]] = None

    def record(self, commands: list[Command]) -> None:
        with self._lock:
            self._sends.append(commands)

    @property
    def sends(self) -> list[list[Command]]:
        """A snapshot of the round trips so far."""
        with self._lock:
            return list(self._sends)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._sends)

    def names(self, handshake: bool = True) -> list[list[str]]:
        """Command names per round trip, e.g. ``[["EVALSHA"], ["BLPOP"]]``; without
        the round trips of opening a connection when ``handshake`` is False."""
        names = [[c[0].decode().upper() for c in send] for send in self.sends]
        if handshake:
            return names
        return [send for send in names if send[0] not in HANDSHAKE]

    def reset(self) -> None:
        with self._lock:
            self._sends.clear()


class CountingConnection(redis.Connection):
    """A ``redis.Connection`` that records each round trip in a :class:`RoundTrips`.

    Handshake commands sent when the connection opens (HELLO, CLIENT SETINFO,
    SELECT) are recorded too, as they are real round trips: warm a client up
    before counting.
    """

    def __init__(self, *args: Any, round_trips: RoundTrips, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_trips = round_trips

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        chunks = [command] if isinstance(command, (bytes, str)) else command
        packed = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        commands = parse_commands(packed)
        hook = self.round_trips.before_send
        if hook is not None:
            hook(commands)
        super().send_packed_command(command, check_health)
        # Recorded once sent: a send that failed to connect carried nothing.
        self.round_trips.record(commands)


def counting_client(url: str, **kwargs: Any) -> tuple[redis.Redis, RoundTrips]:
    """A client on ``url`` whose round trips are recorded; ``kwargs`` go to the pool."""
    trips = RoundTrips()
    pool = redis.ConnectionPool.from_url(
        url, connection_class=CountingConnection, round_trips=trips, **kwargs
    )
    return redis.Redis(connection_pool=pool), trips


def wait_until(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.005, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def collect_earlier_garbage() -> None:
    """gc.collect() what earlier tests left in reference cycles, quietly.

    A test that collects garbage to observe its own objects would otherwise
    also finalize theirs: a connection caught in a cycle (a traceback's
    frames, say) may have its socket finalized before the connection closes
    it, and Python's "unclosed socket" ResourceWarning, an error here, would
    fail the wrong test.  Call it before the test makes its own objects.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def blocked_clients(client: redis.Redis) -> int:
    """How many connections the server sees blocked in a blocking command (BLPOP...)."""
    return sum(1 for c in client.client_list() if "b" in c["flags"])


#: SO_LINGER on, 0 s: close() sends RST, as a reset connection does.
_RST = struct.pack("ii", 1, 0)


class TcpProxy:
    """A loopback TCP proxy to ``host:port`` that can stall, reset or drop.

    ``blackhole()`` silently drops bytes in both directions and keeps every
    socket open, as a network partition does: a client then waits on a reply
    that never comes.  ``stall()`` holds bytes until ``resume()``; ``reset()``
    cuts every connection so far (RST) and keeps accepting new ones.
    ``close()`` closes everything (clients see EOF).
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._dropping = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def blackhole(self) -> None:
        self._dropping.set()

    def stall(self) -> None:
        """Hold every byte (nothing is lost) until :meth:`resume`."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def reset(self) -> None:
        """Cut every connection made so far (clients see a reset); keep listening."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # (wakes the pump threads blocked on it)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name="test-tcp-proxy", daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:  # the server is down (restarting): so is this connection
                downstream.close()
                continue
            with self._lock:
                self._sockets += [downstream, upstream]
            self._spawn(self._pump, downstream, upstream)
            self._spawn(self._pump, upstream, downstream)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while not self._flowing.wait(0.05):
                    if self._closed.is_set():
                        return
                if not self._dropping.is_set():
                    dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def keys_of(commands: Iterable[Command], numkeys_at: int = 2) -> list[bytes]:
    """The KEYS of EVAL/EVALSHA commands (``EVALSHA sha numkeys key...``)."""
    out: list[bytes] = []
    for c in commands:
        n = int(c[numkeys_at])
        out += c[numkeys_at + 1 : numkeys_at + 1 + n]
    return out


def sha(name: str) -> bytes:
    """The SHA1 of one of the library's scripts, as EVALSHA carries it."""
    value = scripts.get(name).sha
    return value if isinstance(value, bytes) else value.encode()


def server_ms(r: redis.Redis) -> int:
    """The server's clock (TIME) in ms, the clock that lease deadlines are on."""
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- processes -------------------------------------------------------------------


@contextlib.contextmanager
def forking() -> Iterator[None]:
    # Python 3.12+ warns about fork() in a process with threads (the keeper's);
    # the children here only run code that is fork-safe by design (see renewal.py).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*fork.*", DeprecationWarning)
        yield


def fork_context() -> Any:
    return multiprocessing.get_context("fork")


@contextlib.contextmanager
def running(procs: Sequence[Any]) -> Iterator[Sequence[Any]]:
    """Start forked processes; on the way out, kill and reap any still alive."""
    try:
        with forking():
            for p in procs:
                p.start()
        yield procs
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def race(
    target: Callable[..., None],
    args: Sequence[tuple[Any, ...]],
    out_dir: Path,
    timeout: float = 60.0,
) -> list[Optional[int]]:
    """Run ``target(*args[i], go, out)`` in forked processes let go at the same moment.

    Process ``i`` writes what it saw to ``out_dir/<i>.json`` (read back with
    :func:`outputs`).  Returns the exit codes, in the order of ``args``.
    """
    ctx = fork_context()
    go = ctx.Event()
    procs = [
        ctx.Process(target=target, args=(*a, go, str(out_dir / f"{i}.json")))
        for i, a in enumerate(args)
    ]
    with running(procs):
        go.set()
        for p in procs:
            p.join(timeout)
    return [p.exitcode for p in procs]


def outputs(out_dir: Path, n: int) -> list[Any]:
    """What the ``n`` processes of a :func:`race` wrote, in process order."""
    return [json.loads((out_dir / f"{i}.json").read_text()) for i in range(n)]


def kill_now(proc: Any) -> float:
    """SIGKILL ``proc``, reap it, and return when that was (monotonic)."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(5)
    return time.monotonic()


class Attempt(threading.Thread):
    """``hold.acquire(timeout=timeout)`` in a thread.

    ``ok`` is what it returned, or ``error`` what it raised; ``at`` when it
    returned (monotonic; NaN, which fails every comparison, until then) and
    ``seconds`` how long it took.
    """

    def __init__(self, hold: Any, timeout: float) -> None:
        super().__init__(name="test-acquire", daemon=True)
        self.hold = hold
        self.timeout = timeout
        self.ok: Optional[bool] = None
        self.error: Optional[Exception] = None
        self.at = self.seconds = float("nan")

    def run(self) -> None:
        started = time.monotonic()
        try:
            self.ok = self.hold.acquire(timeout=self.timeout)
        except Exception as exc:
            self.error = exc
        self.at = time.monotonic()
        self.seconds = self.at - started


# -- recorded intervals ----------------------------------------------------------


def intervals(records: Iterable[dict[str, Any]]) -> list[Interval]:
    """``(start, end)`` of recorded runs."""
    return [(r["start"], r["end"]) for r in records]


def peak_overlap(spans: Iterable[Interval]) -> int:
    """The largest number of intervals open at one instant (touching ones do not overlap)."""
    spans = list(spans)
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = current = 0
    for _, step in events:  # an end sorts before a start at the same instant
        current += step
        peak = max(peak, current)
    return peak


def overlapping(a: Interval, b: Interval) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def assert_rising(fences: Sequence[Any]) -> None:
    """Fences strictly increase, in the order given (grant order)."""
    falls = [(a, b) for a, b in zip(fences, fences[1:]) if not b > a]
    assert falls == [], f"fences did not rise: {falls[:5]}"


def assert_no_overlap(records: list[dict[str, Any]]) -> None:
    """No two recorded bodies ran at the same time."""
    ordered = sorted(records, key=lambda r: r["start"])
    for before, after in zip(ordered, ordered[1:]):
        assert after["start"] >= before["end"], (
            f"bodies overlap: {before['id']} ran {before['start']:.3f}..{before['end']:.3f}, "
            f"{after['id']} started at {after['start']:.3f}"
        )


def utilisation(spans: list[Interval], limit: int) -> float:
    """Busy time over ``limit`` x the wall time from the first start to the last end."""
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return sum(e - s for s, e in spans) / (limit * wall)


def report(label: str, **values: Any) -> None:
    """Print a measurement (shown with ``pytest -s``), and append it as a JSON line to
    $REDISLOCK_MEASUREMENTS when that is set."""
    shown = ", ".join(
        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
    print(f"\n[measure] {label}: {shown}")
    path = os.environ.get("REDISLOCK_MEASUREMENTS")
    if path:
        with Path(path).open("a") as f:
            f.write(json.dumps({"name": label, **values}) + "\n")
