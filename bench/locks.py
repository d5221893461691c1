"""Lock benchmark: celery_redislock.Lock side by side with its peers.

Starts one private redis-server on a free loopback port and measures, in one
run, celery_redislock.Lock, redis-py's Lock, python-redis-lock and pottery's
Redlock, plus three baselines (a bare PING; a bare BLPOP/RPUSH token list; and
the least an owner-checked FIFO handoff through a Lua script does, for the
price of scripting itself):

* round trips per uncontended acquire + release, counted client-side (every
  socket write of a command, or of a pipeline, is one round trip);
* median and p99 time of an uncontended acquire + release;
* handoff latency: a waiter in another process is blocked in ``acquire()``
  when the holder releases; latency is the waiter's acquire-return time minus
  the holder's release-call time, both read from CLOCK_MONOTONIC, which all
  processes of a Linux machine share.  ``--segments`` also splits each
  handoff in three: the holder's client from the release call to its command
  going out; from there to the waiter's client reading the wake-up (Redis's
  work, the wake-up, the read); and from that read to ``acquire()``
  returning (the waiter's client).  Timing the segments costs both sides a
  clock read per command and per reply.

The timed work runs in interleaved batches (every contender, in rotating
order, then again), so a burst of load on the machine spreads over all of
them instead of landing on one.  Prints a markdown table; ratios are against
celery_redislock in the same run.  A benchmark, not a test: it never asserts.

    python bench/locks.py [--cycles N] [--handoffs N] [--hold-ms MIN MAX] [--segments]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import platform
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any, Callable, Optional

import async_locks
import redis
from common import add_hold_ms, command_name, log, p99, private_server, split, time_cycles
from redis.connection import Connection

#: The lease of every lock, in seconds, for every library.
TTL = 10
#: Uncontended cycles run before anything is counted or timed.
WARMUP_CYCLES = 100
#: Uncontended cycles whose commands are counted (a pass of its own, not timed).
COUNTED_CYCLES = 200
#: The timed cycles and handoffs are split into this many interleaved batches.
BATCHES = 5
#: Handoffs run at the start of every batch and not measured (connections,
#: scripts, threads, the first pass through cold code after fork).
WARMUP_HANDOFFS = 2

# CLOCK_MONOTONIC on Linux: one clock for every process, so a timestamp taken
# in the holder can be subtracted from one taken in the waiter.
now = time.monotonic


# -- counting round trips -------------------------------------------------------------


class CountingConnection(Connection):
    """A redis-py Connection that logs the command name of every write, when asked.

    redis-py writes one command, or one whole pipeline, per
    ``send_packed_command`` call and then reads the reply: one call is one
    round trip.
    """

    #: Names of the commands written since recording started; None: not recording.
    sent: Optional[list[str]] = None

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        log = CountingConnection.sent
        if log is not None:
            log.append(command_name(command))
        super().send_packed_command(command, check_health)


class TimingConnection(CountingConnection):
    """With --segments: when the first command went out since ``first_send``
    was set to None, and when the last reply was read (in this process)."""

    first_send: Optional[float] = None
    last_read = 0.0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if TimingConnection.first_send is None:
            TimingConnection.first_send = now()
        super().send_packed_command(command, check_health)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        reply = super().read_response(*args, **kwargs)
        TimingConnection.last_read = now()
        return reply


def make_client(port: int, timing: bool = False) -> redis.Redis:
    kind = TimingConnection if timing else CountingConnection
    pool = redis.ConnectionPool(host="127.0.0.1", port=port, connection_class=kind)
    return redis.Redis(connection_pool=pool)


# -- the contenders -------------------------------------------------------------------


@dataclass(frozen=True)
class Contender:
    label: str
    #: (client, name) -> an object with acquire() (blocking) and release().
    make: Callable[[redis.Redis, str], Any]
    #: Called once per lock name before the lock is first used.
    seed: Optional[Callable[[redis.Redis, str], None]] = None
    #: Whether handoffs are measured (not for PING, which is no lock).
    handoff: bool = True
    #: Whether ``make`` takes a ``redis.asyncio`` client and returns a lock
    #: whose acquire() and release() are coroutines (see async_locks.py).
    asynchronous: bool = False


def _ours(client: redis.Redis, name: str) -> Any:
    import celery_redislock

    # Defaults: background renewal on (the keeper thread), wait forever.
    return celery_redislock.Lock(client, name, ttl=TTL)


def _redis_py(client: redis.Redis, name: str) -> Any:
    # Defaults: blocking=True, sleep=0.1 s between polls.
    return client.lock(name, timeout=TTL)


def _python_redis_lock(client: redis.Redis, name: str) -> Any:
    import redis_lock

    # auto_renewal=False (its default): True starts and joins a thread per hold.
    return redis_lock.Lock(client, name, expire=TTL, auto_renewal=False)


def _pottery(client: redis.Redis, name: str) -> Any:
    import pottery

    # Defaults otherwise: a blocked acquire retries after uniform(0, 0.2) s.
    return pottery.Redlock(key=name, masters={client}, auto_release_time=TTL)


class TokenList:
    """The floor of a push handoff: one token in a list, BLPOP takes it, RPUSH gives it back.

    A mutex with no lease, no owner check and no queue: nothing a real lock
    could beat, through the same client and the same wake-up path.
    """

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name

    @staticmethod
    def seed(client: redis.Redis, name: str) -> None:
        client.delete(name)
        client.rpush(name, 1)

    def acquire(self) -> bool:
        return self.client.blpop([self.name], 0) is not None

    def release(self) -> None:
        self.client.rpush(self.name, 1)


class ScriptedQueue:
    """The least a scripted FIFO handoff with an owner check can do: one script
    per call, four commands in the handing-over one.

    Release: the owner's GET, the head's ZPOPMIN, the new owner's SET and the
    wake-up's RPUSH.  Acquire: SET NX, or ZADD to the queue and BLPOP a
    private wake list.  No lease, no fence, no check that the head is alive,
    nothing that expires: what running any owner-checked handoff through Lua
    costs, for celery_redislock's figure to be read against.
    """

    ACQUIRE = """
    if redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 1 end
    redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
    return 0
    """
    RELEASE = """
    if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
    local head = redis.call('ZPOPMIN', KEYS[2])[1]
    if not head then redis.call('DEL', KEYS[1]) return 1 end
    redis.call('SET', KEYS[1], head)
    redis.call('RPUSH', ARGV[2] .. head, 1)
    return 1
    """

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.keys = (name, f"{{{name}}}:queue", f"{{{name}}}:arrivals")
        self.wake = f"{{{name}}}:wake:"
        self.acquire_sha = client.script_load(self.ACQUIRE)
        self.release_sha = client.script_load(self.RELEASE)
        self.token = ""

    def acquire(self) -> bool:
        self.token = os.urandom(8).hex()
        if self.client.evalsha(self.acquire_sha, 3, *self.keys, self.token):
            return True
        return self.client.blpop([self.wake + self.token], 0) is not None

    def release(self) -> None:
        self.client.evalsha(self.release_sha, 2, *self.keys[:2], self.token, self.wake)


class Ping:
    """One PING per "cycle": the cost of one round trip."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client

    def acquire(self) -> bool:
        return bool(self.client.ping())

    def release(self) -> None:
        pass


TOKEN_LIST = "baseline: token list (BLPOP + RPUSH)"
SCRIPTED_QUEUE = "baseline: scripted queue (4 commands)"
CONTENDERS = [
    Contender("celery_redislock", _ours),
    Contender("celery_redislock asyncio", async_locks.ours, asynchronous=True),
    Contender("redis-py asyncio Lock", async_locks.redis_py, asynchronous=True),
    Contender("redis-py Lock", _redis_py),
    Contender("python-redis-lock", _python_redis_lock),
    Contender("pottery Redlock", _pottery),
    Contender(TOKEN_LIST, TokenList, TokenList.seed),
    Contender(SCRIPTED_QUEUE, ScriptedQueue),
    Contender("baseline: Redis PING", Ping, handoff=False),
]
BASELINE = CONTENDERS[0].label


@dataclass
class Result:
    contender: Contender
    lock: Any
    round_trips: float = 0.0
    commands: str = ""
    cycles: list[float] = field(default_factory=list)
    #: (latency, how long the waiter had been in acquire() when the holder released)
    handoffs: list[tuple[float, float]] = field(default_factory=list)
    #: The median handoff latency of each batch.
    batch_medians: list[float] = field(default_factory=list)
    #: The median uncontended cycle of each batch.
    batch_cycles: list[float] = field(default_factory=list)
    #: With --segments, per handoff: (release call to send, send to the
    #: waiter's read of the wake-up, that read to acquire() returning).
    segments: list[tuple[float, float, float]] = field(default_factory=list)


# -- uncontended cycles -----------------------------------------------------------------


def prepare(client: redis.Redis, c: Contender) -> Result:
    """Warm up, then count the commands of COUNTED_CYCLES uncontended cycles."""
    name = f"bench:cycle:{c.label}"
    if c.seed is not None:
        c.seed(client, name)
    port = client.connection_pool.connection_kwargs["port"]
    lock = async_locks.Driven(c.make, port, name) if c.asynchronous else c.make(client, name)
    for _ in range(WARMUP_CYCLES):
        lock.acquire()
        lock.release()
    CountingConnection.sent = async_locks.AsyncCountingConnection.sent = sent = []
    for _ in range(COUNTED_CYCLES):
        lock.acquire()
        lock.release()
    CountingConnection.sent = async_locks.AsyncCountingConnection.sent = None
    counts = Counter(sent)
    commands = ", ".join(
        name if n == COUNTED_CYCLES else f"{name} x{n / COUNTED_CYCLES:g}"
        for name, n in counts.most_common()
    )
    return Result(c, lock, len(sent) / COUNTED_CYCLES, commands)


# -- handoffs between two processes -------------------------------------------------------


def handoff_player(
    c: Contender,
    port: int,
    name: str,
    peer: Any,
    holds_first: bool,
    rounds: int,
    hold: tuple[float, float],
    out: Any,
    segments: bool = False,
) -> None:
    """One of two processes playing ping-pong with one lock; roles swap every round.

    A round: the holder tells the waiter it holds the lock; the waiter answers
    that it is about to call acquire() and calls it; the holder sleeps a
    random ``hold`` (s), notes the time and releases, then sends that time
    (and the time its command went out, with ``segments``); the waiter, now
    the holder, records acquire-return minus release-call.  The rounds run in
    a coroutine, so that an asyncio lock is awaited in its own event loop; a
    sync lock's calls are made from it directly.
    """
    if c.asynchronous:
        samples = asyncio.run(async_locks.play(c, port, name, peer, holds_first, rounds, hold))
        out.send(samples)
        return
    client = make_client(port, timing=segments)
    warm = c.make(client, name + ":warm")  # connect, load scripts, start threads
    warm.acquire()
    warm.release()
    lock = c.make(client, name)
    samples = asyncio.run(
        async_locks.rounds(
            async_locks.awaiting(lock.acquire),
            async_locks.awaiting(lock.release),
            peer,
            holds_first,
            rounds,
            hold,
            TimingConnection if segments else None,
        )
    )
    out.send(samples)
    client.close()


def run_handoffs(
    client: redis.Redis,
    c: Contender,
    name: str,
    handoffs: int,
    hold: tuple[float, float],
    segments: bool = False,
) -> list[tuple[float, float, Optional[tuple[float, float, float]]]]:
    """WARMUP_HANDOFFS + ``handoffs`` rounds between two forked processes:
    (latency, time blocked, segments or None) of each measured one."""
    if c.seed is not None:
        c.seed(client, name)
        c.seed(client, name + ":warm")
    port = client.connection_pool.connection_kwargs["port"]
    rounds = WARMUP_HANDOFFS + handoffs
    ctx = multiprocessing.get_context("fork")
    ends = ctx.Pipe()
    outs, procs = [], []
    for end, first in zip(ends, (True, False)):
        receive, send = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=handoff_player,
            args=(c, port, name, end, first, rounds, hold, send, segments),
            daemon=True,
        )
        p.start()
        send.close()  # so that a player dying without reporting reads as EOF
        outs.append(receive)
        procs.append(p)
    samples = []
    deadline = now() + 60 + rounds * (hold[1] + 0.5)
    while outs and now() < deadline:
        for receive in list(outs):
            if receive.poll(0.05):
                with contextlib.suppress(EOFError):
                    samples.extend(receive.recv())
                outs.remove(receive)
        if any(p.exitcode not in (None, 0) for p in procs):
            log(f"warning: a {c.label} handoff player failed (traceback above)")
            break
    for p in procs:
        p.join(5)
        if p.is_alive():  # stuck: do not let one library hang the whole run
            log(f"warning: {c.label} handoff player {p.pid} stuck, terminating it")
            p.terminate()
            p.join()
    return [(lat, blocked, parts) for i, lat, blocked, parts in samples if i >= WARMUP_HANDOFFS]


# -- report ------------------------------------------------------------------------------


def ms(seconds: Optional[float], digits: int = 3) -> str:
    if seconds is None:
        return "-"
    value = seconds * 1000
    return f"{value:.{digits}f}" if value < 10 else f"{value:.1f}"


def handoff_median(r: Result) -> Optional[float]:
    return statistics.median(h[0] for h in r.handoffs) if r.handoffs else None


def table(results: list[Result]) -> str:
    base = handoff_median(next(r for r in results if r.contender.label == BASELINE))
    lines = [
        "| library | round trips/cycle | cycle median (ms) | cycle p99 (ms) "
        "| handoff median (ms) | handoff p99 (ms) | handoff ratio vs celery_redislock |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        median = handoff_median(r)
        tail = p99([h[0] for h in r.handoffs]) if r.handoffs else None
        ratio = f"{median / base:.1f}x" if median is not None and base else "-"
        lines.append(
            f"| {r.contender.label} | {r.round_trips:g} | {ms(statistics.median(r.cycles))} "
            f"| {ms(p99(r.cycles))} | {ms(median)} | {ms(tail)} | {ratio} |"
        )
    return "\n".join(lines)


def paired(results: list[Result]) -> str:
    """Figures paired batch by batch: celery_redislock's handoff against the two
    handoff baselines, and its asyncio Lock against its sync Lock (handoff)
    and against redis-py's asyncio Lock (uncontended cycle).

    The machine's speed drifts over a run (other tenants, frequency scaling)
    by more than the difference measured; batches run the contenders back to
    back, so the ratio of two medians of one batch cancels most of that drift.
    """

    def row(label: str) -> Result:
        return next(r for r in results if r.contender.label == label)

    ours, ours_async = row(BASELINE), row("celery_redislock asyncio")
    pairs = [
        (ours, row(TOKEN_LIST), "batch_medians", "Handoff vs the token-list floor"),
        (ours, row(SCRIPTED_QUEUE), "batch_medians", "Handoff vs the scripted queue"),
        (ours_async, ours, "batch_medians", "asyncio handoff vs the sync Lock's"),
        (
            ours_async,
            row("redis-py asyncio Lock"),
            "batch_cycles",
            "asyncio uncontended cycle vs redis-py's asyncio Lock's",
        ),
    ]
    lines = []
    for mine, other, figure, what in pairs:
        ratios = [a / b for a, b in zip(getattr(mine, figure), getattr(other, figure)) if b]
        if not ratios:
            lines.append(f"{what}: no batches measured.")
            continue
        lines.append(
            f"{what}, per batch (median of each, {len(ratios)} batches): "
            f"median ratio {statistics.median(ratios):.2f}x, "
            f"range {min(ratios):.2f}-{max(ratios):.2f}x"
        )
    return "\n".join(lines)


def segment_table(results: list[Result]) -> str:
    """Where each contender's handoff goes (medians of each segment, µs)."""
    lines = [
        "Handoff segments, medians in µs (--segments):",
        "",
        "| library | release call to send | send to the waiter's read | read to acquire() return |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        if r.segments:
            cells = " | ".join(f"{statistics.median(part) * 1e6:.0f}" for part in zip(*r.segments))
            lines.append(f"| {r.contender.label} | {cells} |")
    return "\n".join(lines)


def details(results: list[Result]) -> str:
    lines = ["Commands written per uncontended cycle, and handoff sanity checks:", ""]
    for r in results:
        line = f"- {r.contender.label}: {r.commands}"
        if r.handoffs:
            blocked = min(h[1] for h in r.handoffs)
            line += (
                f"; {len(r.handoffs)} handoffs, the waiter had been in acquire() "
                f"for at least {ms(blocked, 1)} ms at every release"
            )
            early = sum(1 for h in r.handoffs if h[0] < 0)
            if early:
                line += f"; {early} WAITER(S) RETURNED BEFORE THE RELEASE CALL"
        lines.append(line)
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cycles", type=int, default=2000, help="uncontended cycles per library")
    parser.add_argument("--handoffs", type=int, default=50, help="measured handoffs per library")
    parser.add_argument(
        "--batches", type=int, default=BATCHES, help=f"interleaved batches (default {BATCHES})"
    )
    parser.add_argument(
        "--segments",
        action="store_true",
        help="also split each handoff into the holder's, the server's and the waiter's part",
    )
    add_hold_ms(parser)
    args = parser.parse_args(argv)
    low, high = args.hold_ms
    batches = args.batches
    if args.cycles < 1 or args.handoffs < batches or batches < 1 or not 1 <= low <= high:
        parser.error(
            "--cycles and --batches must be positive, --handoffs at least --batches, "
            "and 1 <= --hold-ms MIN <= MAX"
        )
    hold = (low / 1000, high / 1000)

    server = private_server()
    try:
        client = make_client(server.port)
        libs = ", ".join(
            f"{d} {version(d)}" for d in ("celery-redislock", "python-redis-lock", "pottery")
        )
        log(
            f"redis-server {client.info('server')['redis_version']} on 127.0.0.1:{server.port}; "
            f"Python {platform.python_version()}, redis-py {redis.__version__}, {libs}; "
            f"{os.cpu_count()} CPUs"
        )
        log(
            f"ttl {TTL} s; {args.cycles} cycles; {args.handoffs} handoffs, holder releases "
            f"{low:g}-{high:g} ms after the waiter calls acquire(); {batches} batches"
        )
        results = [prepare(client, c) for c in CONTENDERS]
        cycles, handoffs = split(args.cycles, batches), split(args.handoffs, batches)
        for b in range(batches):
            started = now()
            k = b % len(results)
            for r in results[k:] + results[:k]:
                timed = r.lock.time_cycles if r.contender.asynchronous else None
                times = timed(cycles[b]) if timed else time_cycles(r.lock, cycles[b])
                r.cycles += times
                r.batch_cycles.append(statistics.median(times))
                c = r.contender
                if c.handoff and handoffs[b]:
                    name = f"bench:handoff:{c.label}:{b}"
                    batch = run_handoffs(client, c, name, handoffs[b], hold, args.segments)
                    r.handoffs += [(lat, blocked) for lat, blocked, _ in batch]
                    r.segments += [parts for _, _, parts in batch if parts is not None]
                    if batch:
                        r.batch_medians.append(statistics.median(h[0] for h in batch))
            log(f"  batch {b + 1}/{batches}: {now() - started:.1f} s")
        for r in results:
            if r.contender.handoff and len(r.handoffs) < args.handoffs:
                log(f"warning: {r.contender.label}: {len(r.handoffs)} handoffs measured")
        print(table(results))
        print()
        print(details(results))
        print()
        print(paired(results))
        if args.segments:
            print()
            print(segment_table(results))
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
