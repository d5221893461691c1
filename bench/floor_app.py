"""Tasks of bench/floor.py: where the cost of a lock around a no-op task goes.

Loaded by the benchmark and by its worker (``celery -A floor_app``); it
imports bench_app, so the same worker serves plain Celery and LockedTask too.

- ``raw1_noop`` / ``raw2_noop``: one / two bare PINGs from the pool child on
  a raw socket (no client library): the cheapest Redis command there is.
- ``early_noop``: the PING is sent as the child's tracer starts the run, and
  its reply is read in the body: does overlapping the round trip with the
  tracer's own work hide its cost?
- ``mainloop_noop``: a LockedTask whose lock is acquired and released by the
  worker's *main* process, on its event loop: the commands queued in one loop
  iteration are written together (``hub.on_tick``), replies are read when
  the socket is readable, the job goes to the pool once the acquire's reply
  is in (token and fence in the request), and the release is queued when the
  child reports success.  The pool child touches Redis not at all.  A
  prototype for this measurement only: no contention policy in the main
  process (a contended acquire falls back to the child's ordinary path),
  no renewal while a job waits for a free child, no failure path, no reaping.
"""

from __future__ import annotations

import collections
import socket
from typing import Any, Callable, Optional
from urllib.parse import urlparse

from bench_app import LOCK_URL, app
from celery import signals
from celery.worker.strategy import default as default_strategy

from celery_redislock import LockedTask, resp, scripts
from celery_redislock import signals as lock_signals
from celery_redislock._common import new_token
from celery_redislock.policy import owner_prefix
from celery_redislock.primitive import Primitive
from celery_redislock.task import Hold
from celery_redislock.wire import _arg

PING = b"*1\r\n$4\r\nPING\r\n"
_sock: Optional[socket.socket] = None


def raw_socket() -> socket.socket:
    """This process's raw connection to the lock store (db 0)."""
    global _sock
    if _sock is None:
        url = urlparse(LOCK_URL)
        _sock = socket.create_connection((url.hostname, url.port))
        _sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _sock


@app.task(name="floor.raw1_noop")
def raw1_noop(i: int) -> int:
    s = raw_socket()
    s.sendall(PING)
    s.recv(64)
    return i


@app.task(name="floor.raw2_noop")
def raw2_noop(i: int) -> int:
    s = raw_socket()
    for _ in range(2):
        s.sendall(PING)
        s.recv(64)
    return i


@app.task(name="floor.early_noop")
def early_noop(i: int) -> int:
    raw_socket().recv(64)  # the PING went out when the tracer started
    return i


@signals.worker_process_init.connect
def _send_ping_at_tracer_start(**_: Any) -> None:
    task = app.tasks["floor.early_noop"]
    tracer = task.__trace__

    def trace(uuid: str, args: Any, kwargs: Any, request: Any = None) -> Any:
        raw_socket().sendall(PING)
        return tracer(uuid, args, kwargs, request)

    task.__trace__ = trace


# -- the main-process prototype ------------------------------------------------


class MainLoopLocker:
    """Lock commands of the worker's main process, batched per event-loop iteration."""

    def __init__(self) -> None:
        from kombu.asynchronous import get_event_loop

        s = raw_socket()
        for name in ("lock_acquire", "lock_release"):  # EVALSHA needs them loaded
            s.sendall(b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n" + _arg(scripts.get(name).script))
            resp.read_reply(s)
        s.setblocking(False)
        self.sock = s
        self.out: list[bytes] = []
        self.waiting: collections.deque[Callable[[Any], None]] = collections.deque()
        self.buf = b""
        hub = get_event_loop()
        hub.add_reader(s.fileno(), self.on_readable)
        hub.on_tick.add(self.flush)

    def submit(self, command: bytes, on_reply: Callable[[Any], None]) -> None:
        self.out.append(command)
        self.waiting.append(on_reply)

    def flush(self) -> None:
        if self.out:
            self.sock.setblocking(True)
            self.sock.sendall(b"".join(self.out))
            self.sock.setblocking(False)
            self.out.clear()

    def on_readable(self) -> None:
        try:
            buf = self.buf + self.sock.recv(65536)
        except BlockingIOError:
            return
        pos = 0
        while pos < len(buf):
            try:
                reply, pos = resp._parse(buf, pos)
            except resp._Incomplete:
                break
            self.waiting.popleft()(reply)
        self.buf = buf[pos:]


_locker: Optional[MainLoopLocker] = None


def command(prim: Primitive, script: str, args: list[Any]) -> bytes:
    return prim._keyblock().head(scripts.get(script).sha, len(args)) + b"".join(
        [_arg(a) for a in args]
    )


def _ignore(reply: Any) -> None:
    pass


class PoolProxy:
    """The pool as Celery's request class sees it: apply_async waits for the lock."""

    def __init__(self, pool: Any, task: Any) -> None:
        self._pool = pool
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def apply_async(self, trace: Any, args: Any = (), **kw: Any) -> None:
        global _locker
        if _locker is None:
            _locker = MainLoopLocker()
        task, request = self._task, kw["accept_callback"].__self__
        name, kind = task.lock_target_for(request.args, request.kwargs)
        prim = task._redislock_primitive(name, kind, owner_prefix(request.id, "main", 0))
        token = new_token(prim.owner)

        def acquired(reply: Any) -> None:
            if isinstance(reply, int):  # the bare fence: held
                args[2]["floor_token"], args[2]["floor_fence"] = token, reply
                release = command(prim, "lock_release", prim._release_args(token))
                on_success = kw["callback"]

                def released_then(*a: Any, **k: Any) -> Any:
                    _locker.submit(release, _ignore)  # type: ignore[union-attr]
                    return on_success(*a, **k)

                kw["callback"] = released_then
            self._pool.apply_async(trace, args=args, **kw)

        acquire = command(prim, "lock_acquire", prim._acquire_args(token, 0, "", False, None))
        _locker.submit(acquire, acquired)


class _Consumer:
    def __init__(self, consumer: Any, pool: Any) -> None:
        self.__dict__.update(_consumer=consumer, pool=pool)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Any:
    """Celery's default strategy, with the pool seen through PoolProxy."""
    proxy = _Consumer(consumer, PoolProxy(consumer.pool, task))
    return default_strategy(task, app, proxy, **kwargs)


class MainLoopLocked(LockedTask):  # type: ignore[misc]
    Strategy = "floor_app:strategy"

    def _redislock_enter(self, request: Any, args: Any, kwargs: Any) -> Any:
        token = getattr(request, "floor_token", None)
        if token is None:  # contended in the main process: the ordinary path
            return super()._redislock_enter(request, args, kwargs)
        name, kind = self.lock_target_for(args, kwargs)
        prim = self._redislock_primitive(name, kind, owner_prefix(request.id, "main", 0))
        prim.renew = False
        prim._granted(token, request.floor_fence)
        hold = Hold(self, request, prim)
        hold.released = True  # the main process releases it
        request.redislock, request.lock_fence = hold, prim.fence
        lock_signals.lock_acquired.send(
            sender=self, request=request, key=prim.key, name=name, fence=prim.fence
        )
        return hold


@app.task(name="floor.mainloop_noop", base=MainLoopLocked, lock_key=["i"])
def mainloop_noop(i: int) -> int:
    return i
