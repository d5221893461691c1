"""Semaphore benchmark: celery_redislock.Semaphore against the "Redis in Action" one, then tasks.

Starts one private redis-server on a free loopback port and measures, in one
run:

1. Primitives, celery_redislock.Semaphore against the fair counting
   semaphore of "Redis in Action" (bench/ria_semaphore.py, the baseline),
   with two floors: a token list (BLPOP to take, RPUSH to give back: no
   lease, owner or queue) and one PING:

   * round trips per uncontended acquire, per release and per failed
     non-blocking attempt, counted client-side after a warm-up (every
     ``send_packed_command``, one command or one whole pipeline, is one
     round trip);
   * median and p99 time of an uncontended acquire + release;
   * handoff latency: limit 3, two permits held by the parent throughout;
     of two forked processes one holds the third permit and the other is
     blocked in ``acquire()``; the holder releases a random 5-30 ms later.
     Latency is the waiter's acquire-return time minus the holder's
     release-call time, both read from CLOCK_MONOTONIC, which every process
     of a Linux machine shares.  The RiA waiter polls (10 ms, and 100 ms).
     The holder also notes when its release() returned, which splits the
     latency into the release call and the wake-up after it;
   * the race: N processes hammer one semaphore of limit L; right after
     ``acquire()`` returns each one counts itself into a shared-memory
     counter and out again just before ``release()``, so the counter never
     exceeds the true number of holders: any reading above L is a measured
     violation of the limit.

2. Utilisation of a limit of 3 with real Celery workers (two prefork workers
   of -c 4, 30 tasks of 0.2 s; ideal drain 30 x 0.2 / 3 = 2.0 s).

3. Draining 20 same-key tasks of 0.2 s on one worker of -c 4 under
   ``on_contention`` park, retry and wait (ideal: serial, 4.0 s), counting
   broker messages published (a ``before_task_publish`` receiver in every
   process) and delivered (the worker log's "received" lines).

For 2 and 3 the app stamps every step of every run (published, received,
started in a child, lock acquired, released), and a second table breaks a
handoff down: how long after the body that freed the permit ended each step
of the next run came.

The tasks live in bench/limits_bench_app.py.  Prints markdown tables; a
benchmark, not a test: it never asserts.

    python bench/semaphores.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable, Optional

import redis
from redis.connection import Connection

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "bench")) if p not in sys.path]

from common import (  # noqa: E402
    command_name,
    log,
    p99,
    peak_overlap,
    private_server,
    split,
    time_cycles,
)
from ria_semaphore import RiASemaphore  # noqa: E402

#: Lease of every semaphore, in seconds (ours renews it, RiA's prunes by it).
TTL = 30
#: The limit of every semaphore in part 1.
LIMIT = 3
WARMUP_CYCLES = 100
COUNTED_CYCLES = 200
#: Timed cycles and handoffs run in this many interleaved batches, so a burst
#: of load on the machine spreads over every contender instead of one.
BATCHES = 5
#: Handoffs at the start of every batch that are not measured (connections,
#: scripts, threads, cold code after fork).
WARMUP_HANDOFFS = 2
HOLD = (0.005, 0.030)
#: Processes and hold time (max, seconds) of the race.
RACE_PROCS = 12
RACE_HOLD = 0.001

now = time.monotonic  # CLOCK_MONOTONIC: one clock for every process


# -- round trips --------------------------------------------------------------


class CountingConnection(Connection):
    """A redis-py Connection counting its writes: one ``send_packed_command`` is one round trip."""

    #: Writes by every connection of this process.
    sends = 0
    #: Command names of the writes since recording started; None: not recording.
    names: Optional[list[str]] = None

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        if CountingConnection.names is not None:
            CountingConnection.names.append(command_name(command))
        super().send_packed_command(command, check_health)


def make_client(port: int) -> redis.Redis:
    pool = redis.ConnectionPool(host="127.0.0.1", port=port, connection_class=CountingConnection)
    return redis.Redis(connection_pool=pool)


def trips() -> int:
    return CountingConnection.sends


# -- the contenders -------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    label: str
    #: (client, name, limit) -> an object with acquire(blocking=...) and release().
    make: Callable[[redis.Redis, str, int], Any]
    #: Called with (client, name, limit) before a semaphore name is used.
    seed: Optional[Callable[[redis.Redis, str, int], None]] = None


def _ours(client: redis.Redis, name: str, limit: int) -> Any:
    from celery_redislock import Semaphore

    # Defaults: background renewal on (the keeper thread), FIFO wake-ups.
    return Semaphore(client, name, limit, ttl=TTL)


def _ria(poll: float) -> Callable[[redis.Redis, str, int], Any]:
    def make(client: redis.Redis, name: str, limit: int) -> Any:
        return RiASemaphore(client, name, limit, timeout=TTL, poll=poll)

    return make


class TokenList:
    """The floor of a push handoff: ``limit`` tokens in a list; BLPOP takes one, RPUSH returns it.

    No lease, no owner, no queue: nothing a real semaphore could beat, through
    the same client and the same wake-up path (a blocked BLPOP served by a push).
    """

    def __init__(self, client: redis.Redis, name: str, limit: int) -> None:
        self.client = client
        self.name = name

    @staticmethod
    def seed(client: redis.Redis, name: str, limit: int) -> None:
        client.delete(name)
        client.rpush(name, *range(limit))

    def acquire(self, blocking: bool = True) -> bool:
        if blocking:
            return self.client.blpop([self.name], 0) is not None
        return self.client.lpop(self.name) is not None

    def release(self) -> None:
        self.client.rpush(self.name, 1)


def _ours_no_renewal(client: redis.Redis, name: str, limit: int) -> Any:
    from celery_redislock import Semaphore

    return Semaphore(client, name, limit, ttl=TTL, renew=False)


OURS = Variant("celery_redislock", _ours)
#: Diagnostic: the same without the keeper thread (its add() wakes it on every acquire).
OURS_NO_RENEWAL = Variant("celery_redislock, renew=False", _ours_no_renewal)
FLOOR = Variant("baseline: token list (BLPOP + RPUSH)", TokenList, TokenList.seed)
RIA = Variant("RiA fair semaphore, 10 ms poll", _ria(0.010))
RIA_SLOW = Variant("RiA fair semaphore, 100 ms poll", _ria(0.100))
RIA_TIGHT = Variant("RiA fair semaphore, no sleep", _ria(0.0))


def seed(v: Variant, client: redis.Redis, *names: str) -> None:
    if v.seed is not None:
        for name in names:
            v.seed(client, name, LIMIT)


def filler(v: Variant, client: redis.Redis, name: str) -> Any:
    """A permit held for a whole batch (no renewal thread in a process that forks)."""
    if v is OURS:
        from celery_redislock import Semaphore

        return Semaphore(client, name, LIMIT, ttl=300, renew=False)
    return v.make(client, name, LIMIT)


# -- 1a. uncontended: round trips and cycle time --------------------------------


@dataclass
class Cycles:
    variant: Variant
    sem: Any = None
    acquire: float = 0.0
    release: float = 0.0
    failed: float = 0.0
    commands: str = ""
    times: list[float] = field(default_factory=list)


def describe(names: list[str], per: int) -> str:
    return ", ".join(
        n if c == per else f"{n} x{c / per:g}" for n, c in Counter(names).most_common()
    )


def count_cycles(client: redis.Redis, v: Variant) -> Cycles:
    """Warm up, then count the round trips of COUNTED_CYCLES acquires, releases, failures."""
    name = f"bench:cycle:{v.label}"
    seed(v, client, name)
    sem = v.make(client, name, LIMIT)
    for _ in range(WARMUP_CYCLES):
        sem.acquire()
        sem.release()
    r = Cycles(v, sem)
    CountingConnection.names = names = []
    for _ in range(COUNTED_CYCLES):
        t0 = trips()
        sem.acquire()
        t1 = trips()
        sem.release()
        r.acquire += t1 - t0
        r.release += trips() - t1
    CountingConnection.names = None
    r.acquire /= COUNTED_CYCLES
    r.release /= COUNTED_CYCLES
    r.commands = describe(names, COUNTED_CYCLES)
    # A failed non-blocking attempt: the limit is taken by others.
    full = [filler(v, client, name) for _ in range(LIMIT)]
    for f in full:
        f.acquire()
    t0 = trips()
    for _ in range(COUNTED_CYCLES):
        sem.acquire(blocking=False)
    r.failed = (trips() - t0) / COUNTED_CYCLES
    for f in full:
        f.release()
    return r


def ping_floor(client: redis.Redis, n: int) -> tuple[float, float]:
    """Median PING round trip back to back, and after an idle sleep as long as a handoff's hold."""
    rng = random.Random(0)
    tight, idle = [], []
    for _ in range(n):
        t0 = now()
        client.ping()
        tight.append(now() - t0)
    for _ in range(n):
        time.sleep(rng.uniform(*HOLD))
        t0 = now()
        client.ping()
        idle.append(now() - t0)
    return statistics.median(tight), statistics.median(idle)


# -- 1b. handoffs between two processes ------------------------------------------


def handoff_player(
    v: Variant,
    port: int,
    name: str,
    peer: Any,
    holds_first: bool,
    rounds: int,
    out: Any,
) -> None:
    """One of two processes passing the last permit back and forth; roles swap every round.

    A round: the holder tells the waiter it holds the permit; the waiter
    answers that it is about to call acquire() and calls it; the holder
    sleeps a random HOLD, notes the time, releases, and sends that time; the
    waiter, now the holder, records acquire-return minus release-call.
    """
    client = make_client(port)
    warm = v.make(client, name + ":warm", LIMIT)  # connect, load scripts, start threads
    warm.acquire()
    warm.release()
    sem = v.make(client, name, LIMIT)
    rng = random.Random(os.getpid())
    samples: list[tuple[int, float, float, int, float]] = []
    holding = holds_first
    if holding:
        sem.acquire()
    for i in range(rounds):
        if holding:
            peer.send("held")
            peer.recv()  # the peer is about to call acquire()
            time.sleep(rng.uniform(*HOLD))
            released_at = now()
            sem.release()
            peer.send((released_at, now()))
            holding = False
        else:
            peer.recv()
            peer.send("waiting")
            t0 = trips()
            called_at = now()
            sem.acquire()
            got_at = now()
            sent = trips() - t0
            released_at, returned_at = peer.recv()
            samples.append(
                (i, got_at - released_at, released_at - called_at, sent, got_at - returned_at)
            )
            holding = True
    if holding:
        sem.release()
    out.send(samples)
    client.close()


def run_handoffs(
    client: redis.Redis, v: Variant, handoffs: int
) -> list[tuple[float, float, int, float]]:
    """WARMUP_HANDOFFS + ``handoffs`` rounds between two forked processes, LIMIT - 1 filled."""
    name = f"bench:handoff:{v.label}"
    seed(v, client, name, name + ":warm")
    fillers = [filler(v, client, name) for _ in range(LIMIT - 1)]
    for f in fillers:
        f.acquire()
    port = client.connection_pool.connection_kwargs["port"]
    rounds = WARMUP_HANDOFFS + handoffs
    ctx = multiprocessing.get_context("fork")
    ends = ctx.Pipe()
    outs, procs = [], []
    for end, first in zip(ends, (True, False)):
        receive, send = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=handoff_player, args=(v, port, name, end, first, rounds, send), daemon=True
        )
        p.start()
        outs.append(receive)
        procs.append(p)
    samples = []
    deadline = now() + 60 + rounds * 1.0
    for receive in outs:
        if receive.poll(max(0.0, deadline - now())):
            samples.extend(receive.recv())
    for p in procs:
        p.join(5)
        if p.is_alive():
            log(f"warning: {v.label} handoff player {p.pid} stuck, terminating it")
            p.terminate()
            p.join()
    for f in fillers:
        f.release()
    return [(lat, blk, sent, late) for i, lat, blk, sent, late in samples if i >= WARMUP_HANDOFFS]


# -- 1c. the race -------------------------------------------------------------------


def hammer(
    v: Variant,
    port: int,
    name: str,
    blocking: bool,
    seconds: float,
    go: Any,
    holders: Any,
    out: Any,
) -> None:
    """Acquire, count in, hold 0..RACE_HOLD s, count out, release; until ``seconds`` pass."""
    client = make_client(port)
    warm = v.make(client, name + ":warm", LIMIT)
    warm.acquire()
    warm.release()
    sem = v.make(client, name, LIMIT)
    rng = random.Random(os.getpid())
    attempts = grants = over = peak = 0
    go.wait()
    deadline = now() + seconds
    while now() < deadline:
        attempts += 1
        if not sem.acquire(blocking=blocking):
            continue
        with holders.get_lock():
            holders.value += 1
            seen = holders.value
        peak = max(peak, seen)
        over += seen > LIMIT
        time.sleep(rng.uniform(0, RACE_HOLD))
        with holders.get_lock():
            holders.value -= 1
        sem.release()
        grants += 1
    out.send((attempts, grants, peak, over))
    client.close()


@dataclass
class Race:
    label: str
    seconds: float
    attempts: int
    grants: int
    peak: int
    over: int


def run_race(port: int, v: Variant, blocking: bool, label: str, seconds: float) -> Race:
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    holders = ctx.Value("i", 0)
    name = f"bench:race:{label}"
    outs, procs = [], []
    for _ in range(RACE_PROCS):
        receive, send = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=hammer,
            args=(v, port, name, blocking, seconds, go, holders, send),
            daemon=True,
        )
        p.start()
        outs.append(receive)
        procs.append(p)
    time.sleep(0.5)  # let every process connect and warm up
    go.set()
    results = []
    for receive in outs:
        if receive.poll(seconds + 60):
            results.append(receive.recv())
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.terminate()
            p.join()
    return Race(
        label,
        seconds,
        sum(r[0] for r in results),
        sum(r[1] for r in results),
        max((r[2] for r in results), default=0),
        sum(r[3] for r in results),
    )


# -- report helpers -----------------------------------------------------------------


def ms(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    value = seconds * 1000
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def table(header: str, rows: list[list[str]]) -> str:
    """A markdown table; ``header`` names the columns separated by "|"."""
    names = [h.strip() for h in header.split("|")]
    align = ["---"] + ["---:"] * (len(names) - 1)
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def cycles_report(client: redis.Redis, cycles: int) -> None:
    log("1. primitives: counting round trips")
    results = [count_cycles(client, v) for v in (OURS, OURS_NO_RENEWAL, RIA, FLOOR)]
    log(f"   timing {cycles} uncontended cycles each")
    for b, n in enumerate(split(cycles, BATCHES)):
        for r in results[b % 4 :] + results[: b % 4]:
            r.times += time_cycles(r.sem, n)
    pings = ping_floor(client, 100 if cycles < 2000 else 200)
    base = statistics.median(results[0].times)
    print("## 1. Primitives: round trips and uncontended cycle (limit 3)\n")
    print(
        table(
            "semaphore | round trips / acquire | / release | / failed try | cycle median (ms)"
            " | cycle p99 (ms) | median vs celery_redislock",
            [
                [
                    r.variant.label.replace(", 10 ms poll", ""),
                    f"{r.acquire:g}",
                    f"{r.release:g}",
                    f"{r.failed:g}",
                    ms(statistics.median(r.times)),
                    ms(p99(r.times)),
                    ratio(statistics.median(r.times), base),
                ]
                for r in results
            ],
        )
    )
    print()
    for r in results:
        print(f"- {r.variant.label.replace(', 10 ms poll', '')}, writes per cycle: {r.commands}")
    print(
        f"- machine floor, one PING round trip: {ms(pings[0])} ms back to back, "
        f"{ms(pings[1])} ms after an idle sleep of {HOLD[0] * 1000:g}-{HOLD[1] * 1000:g} ms "
        "(medians)"
    )
    print()


def handoffs_report(client: redis.Redis, handoffs: int) -> None:
    log(f"   {handoffs} handoffs each (hold {HOLD[0] * 1000:g}-{HOLD[1] * 1000:g} ms)")
    variants = [OURS, RIA, RIA_SLOW, FLOOR]
    samples: dict[str, list[tuple[float, float, int, float]]] = {v.label: [] for v in variants}
    for b, n in enumerate(split(handoffs, BATCHES)):
        for v in variants[b % 4 :] + variants[: b % 4]:
            samples[v.label] += run_handoffs(client, v, n)
    base = statistics.median(s[0] for s in samples[OURS.label])
    rows = []
    for v in variants:
        s = samples[v.label]
        lat = [x[0] for x in s]
        rows.append(
            [
                v.label,
                str(len(s)),
                ms(statistics.median(lat)),
                ms(p99(lat)),
                ratio(statistics.median(lat), base),
                ms(statistics.median(x[0] - x[3] for x in s)),
                ms(statistics.median(x[3] for x in s)),
                f"{statistics.median(x[2] for x in s):g} ({min(x[2] for x in s)}-"
                f"{max(x[2] for x in s)})",
                ms(min(x[1] for x in s)),
            ]
        )
    print("## 1. Handoff latency across processes (release call -> waiter's acquire returns)\n")
    print(
        table(
            "semaphore | handoffs | median (ms) | p99 (ms) | median vs celery_redislock | "
            "holder's release() call, median (ms) | waiter's return after release() returned,"
            " median (ms) | waiter round trips / acquire, median (min-max) | waiter blocked "
            "at least (ms)",
            rows,
        )
    )
    early = sum(1 for s in samples.values() for x in s if x[0] < 0)
    if early:
        print(f"\n**{early} waiter(s) returned before the release call: broken exclusion.**")
    print()


def race_report(port: int, race_s: float) -> None:
    log(f"   race: {RACE_PROCS} processes, limit {LIMIT}, {race_s:g} s per contender")
    races = [
        run_race(port, RIA_TIGHT, False, "RiA fair semaphore, retry at once", race_s),
        run_race(port, RIA, True, "RiA fair semaphore, 10 ms poll", race_s),
        run_race(port, OURS, False, "celery_redislock, non-blocking, retry at once", race_s),
        run_race(port, OURS, True, "celery_redislock, blocking acquire()", race_s),
    ]
    print(
        f"## 1. The race: {RACE_PROCS} processes, limit {LIMIT}, "
        f"holds of 0-{RACE_HOLD * 1000:g} ms\n"
    )
    print(
        table(
            "semaphore | attempts | grants | grants/s | max concurrent holders (measured) | "
            "grants that saw > limit holders",
            [
                [
                    r.label,
                    str(r.attempts),
                    str(r.grants),
                    f"{r.grants / r.seconds:.0f}",
                    f"{r.peak}" + (" **> limit**" if r.peak > LIMIT else ""),
                    f"{r.over} ({r.over / max(1, r.grants):.2%})",
                ]
                for r in races
            ],
        )
    )
    print()


# -- 2 and 3. real workers ------------------------------------------------------------


def inversions(seqs: list[int]) -> int:
    return sum(1 for i in range(len(seqs)) for j in range(i + 1, len(seqs)) if seqs[i] > seqs[j])


@dataclass
class Drain:
    label: str
    runs: list[dict[str, Any]]
    t0: float
    published: int
    received: int


class Bench:
    def __init__(self, server: Any) -> None:
        from tests.workers import Worker

        self.Worker = Worker
        self.base = server.url.rsplit("/", 1)[0]
        os.environ["BENCH_REDIS"] = self.base
        self.mod = import_module("bench.limits_bench_app")
        self.rec = redis.Redis.from_url(self.mod.RECORD_URL)
        self.workers: list[Any] = []

    def start(self, names: list[str]) -> None:
        new = [self.Worker(self.base, 4, name=n, app="bench.limits_bench_app") for n in names]
        self.workers += new
        for w in new:
            w.wait_ready(60)

    def stop(self, name: Optional[str] = None) -> None:
        for w in [w for w in self.workers if name in (None, w.name)]:
            w.stop()
            self.workers.remove(w)

    def received(self, task: str) -> int:
        needle = f"Task {task}["
        return sum(
            1
            for w in self.workers
            for line in w.output().splitlines()
            if needle in line and line.rstrip().endswith("received")
        )

    def published(self, task: str) -> int:
        return int(self.rec.hget(self.mod.PUBLISHED, task) or 0)

    def drain(self, task: Any, n: int, duration: float, tag: str, **kwargs: Any) -> Drain:
        pub0, rec0 = self.published(task.name), self.received(task.name)
        t0 = now()
        for i in range(n):
            task.apply_async(kwargs={**kwargs, "tag": tag, "seq": i, "duration": duration})
        key = f"runs:{tag}"
        deadline = now() + 120
        while self.rec.llen(key) < n and now() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # a second run of anything would show up here
        runs = [json.loads(x) for x in self.rec.lrange(key, 0, -1)]
        return Drain(
            tag,
            runs,
            t0,
            self.published(task.name) - pub0,
            self.received(task.name) - rec0,
        )

    def warm(self) -> None:
        m = self.mod
        for task in (m.sem3_wait, m.sem3_park):
            self.drain(task, 8, 0.0, f"warm:{task.name}")
        for task in (m.job_park, m.job_retry, m.job_wait):
            for i in range(8):
                task.apply_async(kwargs={"job": f"warm{i}", "tag": "warm", "seq": i, "duration": 0})
        deadline = now() + 30
        while self.rec.llen("runs:warm") < 24 and now() < deadline:
            time.sleep(0.01)


#: Steps of a handoff, each stamped by bench/limits_bench_app.py: (hash field, which run, label).
STEPS = [
    ("released", "prev", "previous run released (incl. any re-publish)"),
    ("published", "next", "next message last published"),
    ("received", "next", "received by a worker's main process"),
    ("prerun", "next", "started in a pool child (task_prerun)"),
    ("acquired", "next", "lock acquired"),
    ("start", "next", "body started"),
]


def breakdown(bench: Bench, runs: list[dict[str, Any]]) -> list[list[float]]:
    """Per step, the times (s) from the body end that freed a permit to that step of the next run.

    The run that freed it is taken to be the one whose body ended last before
    the next run's body started (exact for a lock; for a semaphore, the usual
    case of FIFO hand-over).
    """
    stamps = {
        r["id"]: {k.decode(): float(v) for k, v in bench.rec.hgetall(f"t:{r['id']}").items()}
        for r in runs
    }
    by_end = sorted(runs, key=lambda r: r["end"])
    out: list[list[float]] = [[] for _ in STEPS]
    for nxt in runs:
        ended = [r for r in by_end if r["end"] <= nxt["start"] and r is not nxt]
        if not ended:
            continue
        prev = ended[-1]
        for i, (step, which, _) in enumerate(STEPS):
            run = prev if which == "prev" else nxt
            at = run["start"] if step == "start" else stamps[run["id"]].get(step)
            if at is not None:
                out[i].append(at - prev["end"])
    return out


def breakdown_table(title: str, steps: dict[str, list[list[float]]]) -> None:
    def cell(values: list[float]) -> str:
        if not values:
            return "-"
        ordered = sorted(values)
        median, p90 = statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]
        if median < 0:
            return "(before)"
        return f"{ms(median)} / {ms(p90)} / {ms(ordered[-1])}"

    print(f"### {title}: ms from the body end that freed it, median / p90 / max over handoffs\n")
    print(
        table(
            "|".join(["step", *steps]),
            [
                [label, *(cell(per[i]) for per in steps.values())]
                for i, (_, _, label) in enumerate(STEPS)
            ],
        )
    )
    print(
        "\n(before): the step came before that body ended (a waiting run had been "
        "received and started long before, and sat blocked in acquire()).  Each "
        "stamp is one HSET, whose round trip is included.\n"
    )


def part2(bench: Bench, rounds: int) -> None:
    n, duration, limit = 30, 0.2, 3
    ideal = n * duration / limit
    log(f"2. semaphore utilisation: {n} tasks x {duration} s, limit {limit}, two workers -c 4")
    m = bench.mod
    rows = []
    steps: dict[str, list[list[float]]] = {}
    for rnd in range(rounds):
        for policy, task in (("wait", m.sem3_wait), ("park", m.sem3_park)):
            d = bench.drain(task, n, duration, f"sem:{policy}:{rnd}")
            if not d.runs:
                log(f"   no run of {task.name} finished; see the worker logs")
                continue
            per = steps.setdefault(policy, [[] for _ in STEPS])
            for i, values in enumerate(breakdown(bench, d.runs)):
                per[i] += values
            iv = [(r["start"], r["end"]) for r in d.runs]
            busy = sum(e - s for s, e in iv)
            first, last = min(s for s, _ in iv), max(e for _, e in iv)
            wall = last - first
            drain = last - d.t0
            pids = len({r["pid"] for r in d.runs})
            rows.append(
                [
                    f"{policy} (round {rnd + 1})",
                    str(peak_overlap(iv)),
                    f"{busy:.2f}",
                    f"{wall:.3f}",
                    f"{busy / (limit * wall):.1%}",
                    ms((limit * wall - busy) / (n - limit)),
                    f"{drain:.3f}",
                    ratio(drain, ideal),
                    str(len(d.runs)),
                    str(pids),
                    f"{d.published} ({d.published - n} re-published)",
                ]
            )
    print(
        f"## 2. Semaphore utilisation: limit {limit}, {n} tasks x {duration} s, "
        f"two workers -c 4 (ideal drain {ideal:.1f} s)\n"
    )
    print(
        table(
            "on_contention | peak concurrency | busy (s) | busy period (s) | utilisation | "
            f"idle permit time per handoff (ms) | drain (s) | drain / ideal {ideal:.1f} s | "
            "bodies run | child processes used | messages published",
            rows,
        )
    )
    print(
        "\nutilisation = busy / (limit x busy period); busy period = first body start to "
        "last body end; idle permit time per handoff = (limit x busy period - busy) / "
        "(tasks - limit); drain = first publish to last body end.\n"
    )
    breakdown_table("2. Where a semaphore handoff goes", steps)


def part3(bench: Bench, rounds: int) -> None:
    n, duration = 20, 0.2
    ideal = n * duration
    log(f"3. {n} same-key tasks x {duration} s on one worker -c 4: park / retry / wait")
    m = bench.mod
    rows = []
    steps: dict[str, list[list[float]]] = {}
    for rnd in range(rounds):
        for policy, task in (("park", m.job_park), ("retry", m.job_retry), ("wait", m.job_wait)):
            d = bench.drain(task, n, duration, f"job:{policy}:{rnd}", job=f"{policy}-{rnd}")
            if not d.runs:
                log(f"   no run of {task.name} finished; see the worker logs")
                continue
            iv = [(r["start"], r["end"]) for r in d.runs]
            drain = max(e for _, e in iv) - d.t0
            seqs = [r["seq"] for r in sorted(d.runs, key=lambda r: r["start"])]
            inv = inversions(seqs)
            per = steps.setdefault(policy, [[] for _ in STEPS])
            for i, values in enumerate(breakdown(bench, d.runs)):
                per[i] += values
            rows.append(
                [
                    f"{policy} (round {rnd + 1})",
                    f"{drain:.3f}",
                    ratio(drain, ideal),
                    str(len(d.runs)),
                    "yes" if inv == 0 else f"no ({inv} inversions)",
                    str(peak_overlap(iv)),
                    f"{d.published} ({d.published - n} re-published)",
                    str(d.received),
                ]
            )
    print(
        f"## 3. {n} same-key tasks x {duration} s, one worker -c 4 (ideal: serial, {ideal:.1f} s)\n"
    )
    print(
        table(
            f"on_contention | drain (s) | drain / ideal {ideal:.1f} s | bodies run | in order "
            "| peak overlap | messages published | deliveries (worker log)",
            rows,
        )
    )
    print(
        "\ndrain = first publish to last body end; in order = bodies started in "
        "submission order (inversions: pairs started out of order); retry backoff "
        "0.05 s doubling to 0.4 s, jittered.\n"
    )

    breakdown_table("3. Where a lock handoff goes", steps)


# -- main ----------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, one round")
    args = parser.parse_args(argv)
    cycles = 500 if args.quick else 2000
    handoffs = 30 if args.quick else 50
    race_s = 1.0 if args.quick else 2.0
    rounds = 1 if args.quick else 2

    server = private_server()
    bench: Optional[Bench] = None
    started = now()
    try:
        client = make_client(server.port)
        print(
            f"redis-server {client.info('server')['redis_version']}, Python "
            f"{platform.python_version()}, redis-py {redis.__version__}, celery "
            f"{version('celery')}, celery-redislock {version('celery-redislock')}; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start\n"
        )
        cycles_report(client, cycles)
        handoffs_report(client, handoffs)
        race_report(server.port, race_s)
        client.close()

        bench = Bench(server)
        log("   starting two workers")
        bench.start(["sem1", "sem2"])
        bench.warm()
        part2(bench, rounds)
        bench.stop("sem2")
        part3(bench, rounds)
    finally:
        if bench is not None:
            bench.stop()
        server.stop()
    print(f"Done in {now() - started:.0f} s; load average {os.getloadavg()[0]:.2f} at the end.")


if __name__ == "__main__":
    main()
