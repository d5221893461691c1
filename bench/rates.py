"""Rate-limit benchmark: celery_redislock's RateLimiter against its peers, and
``global_rate_limit`` on real workers.

Starts one private redis-server on a free loopback port and measures, in one
run, side by side:

1. Accuracy.  ``--accuracy-procs`` processes (4) hammer one limit of 50/s for
   ``--accuracy-s`` seconds (3), each checking in a loop as fast as it can, and
   record every grant.  The figure is the largest number of grants in any
   half-open 1 s window, against the limit.  A grant's moment is known to lie
   between the client's clock read just before its call and just after it
   (``time.time()``: on loopback the server's ``TIME`` and the client-clock
   peers read the same clock), so two figures bound the truth: *at least* (the
   most grants whose whole call lies inside one window: the limit was
   certainly exceeded if this is above it) and *at most* (the most calls that
   overlap one window).  A blocking acquire is measured twice: at its slot (the
   call that takes it, shifted by the seconds to it; ``acquire()`` is that
   call, ``take(None)``, then a sleep of those seconds, done here in the same
   way), and as it returns, when the caller's work would start.
2. Work.  ``--work-procs`` processes (8) check one limit of 50/s in a tight
   loop for ``--work-s`` seconds (2), nearly every check refused: checks per
   second in all, round trips per check (every ``send_packed_command`` of
   redis-py's connections in those processes: a command, or a whole
   pipeline), and redis-server's CPU per check (``INFO cpu``), against a bare
   ``PING`` loop (one round trip doing nothing) and against ours.
3. Workers (see ``bench/rates_workers.py``).

The contenders, each through its documented API on the same server:

* celery_redislock ``RateLimiter(client, name, "50/s")``: ``acquire(blocking=False)``,
  and ``acquire()`` (blocking: sleeps until the slot it reserved);
* ``limits`` with its Redis storage (``RedisStorage``): ``MovingWindowRateLimiter``,
  ``SlidingWindowCounterRateLimiter`` and ``FixedWindowRateLimiter``, ``hit()`` of
  ``RateLimitItemPerSecond(50)``;
* dramatiq's ``WindowRateLimiter(backend, key, limit=50, window=1)`` over its
  ``RedisBackend``, through ``acquire(raise_on_failure=False)`` (its default
  raises ``RateLimitExceeded``; an actor would retry);
* celery-heimdall's global rate limit, ``heimdall={"rate_limit": RateLimit((50, 1))}``: its
  own ``celery_heimdall.task.rate_limited_countdown``, called directly as
  ``HeimdallTask.__call__`` calls it (0 runs now, anything else is the retry
  countdown it would raise), on a stand-in task object that carries only what
  that function reads (``heimdall`` and ``heimdall_redis``).

Rounds run back to back, each contender in turn in rotating order, so that a
slow stretch of the machine does not land on one contender only.  Prints
Markdown tables to stdout, progress to stderr; a benchmark, not a test: it
never asserts.

    python bench/rates.py [--quick] [--rounds N] [--accuracy-procs N] [--accuracy-s S]
                          [--work-procs N] [--work-s S] [--runs N]
                          [--no-primitives] [--no-workers]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import time
import types
import uuid
from bisect import bisect_left
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Optional

import redis
from common import log, private_server

#: The limit of the accuracy and work runs, starts per second.
RATE = 50
#: Peers' packages, for the header.
PACKAGES = ("celery-redislock", "limits", "dramatiq", "celery-heimdall", "celery", "redis")

#: key -> granted (or, for a blocking contender, the seconds to the slot it took).
Check = Callable[[str], Any]


# -- the contenders -----------------------------------------------------------------------
# Each maker runs in the process that checks, after the fork: it builds the library's own
# client of the server at ``url`` and returns ``check(key) -> granted``.


def ours(url: str, blocking: bool = False) -> Check:
    """``acquire(blocking=False)``; ``blocking``: ``take(None)``, the call inside
    ``acquire()``, returning the seconds to the slot it took: the player sleeps
    them, as ``acquire()`` does, and so learns the slot's moment as well."""
    from celery_redislock import RateLimiter

    client = redis.Redis.from_url(url)
    limiters: dict[str, Any] = {}

    def check(key: str) -> Any:
        limiter = limiters.get(key)
        if limiter is None:
            limiter = limiters[key] = RateLimiter(client, key, f"{RATE}/s")
        if blocking:
            return limiter.take(None).delay
        return bool(limiter.acquire(blocking=False))

    return check


def limits_strategy(strategy: str) -> Callable[[str], Check]:
    def make(url: str) -> Check:
        from limits import RateLimitItemPerSecond, strategies
        from limits.storage import RedisStorage

        limiter = getattr(strategies, strategy)(RedisStorage(url))
        item = RateLimitItemPerSecond(RATE)

        def check(key: str) -> bool:
            return bool(limiter.hit(item, key))

        return check

    return make


def dramatiq_window(url: str) -> Check:
    from dramatiq.rate_limits import WindowRateLimiter
    from dramatiq.rate_limits.backends import RedisBackend

    backend = RedisBackend(client=redis.Redis.from_url(url))
    limiters: dict[str, Any] = {}

    def check(key: str) -> bool:
        limiter = limiters.get(key)
        if limiter is None:
            limiter = limiters[key] = WindowRateLimiter(backend, key, limit=RATE, window=1)
        with limiter.acquire(raise_on_failure=False) as acquired:
            return bool(acquired)

    return check


def heimdall(url: str) -> Check:
    from celery_heimdall import RateLimit
    from celery_heimdall.task import rate_limited_countdown

    # What rate_limited_countdown reads of a HeimdallTask, and nothing else; the
    # key is what HeimdallTask passes it for heimdall={"key": key}.
    task = types.SimpleNamespace(
        heimdall={"rate_limit": RateLimit((RATE, 1))}, heimdall_redis=redis.Redis.from_url(url)
    )

    def check(key: str) -> bool:
        return rate_limited_countdown(task, key, (), {}) == 0

    return check


def ping(url: str) -> Check:
    client = redis.Redis.from_url(url)

    def check(key: str) -> bool:
        return bool(client.ping())

    return check


@dataclass
class Contender:
    label: str
    make: Callable[[str], Check]
    #: A blocking acquire: check returns the seconds to its slot, the player sleeps them.
    blocking: bool = False
    accuracy: bool = True
    work: bool = True
    #: A baseline: every call "granted", nothing recorded.
    baseline: bool = False
    accuracy_runs: list[Run] = field(default_factory=list)
    work_runs: list[Run] = field(default_factory=list)


def contenders() -> list[Contender]:
    return [
        Contender("celery_redislock RateLimiter, acquire(blocking=False)", ours),
        Contender(
            "celery_redislock RateLimiter, acquire() (blocking)",
            lambda u: ours(u, True),
            blocking=True,
            work=False,
        ),
        Contender("limits, moving window", limits_strategy("MovingWindowRateLimiter")),
        Contender(
            "limits, sliding-window counter", limits_strategy("SlidingWindowCounterRateLimiter")
        ),
        Contender("limits, fixed window", limits_strategy("FixedWindowRateLimiter")),
        Contender("dramatiq WindowRateLimiter (window=1)", dramatiq_window),
        Contender("celery-heimdall RateLimit((50, 1))", heimdall),
        Contender("baseline: Redis PING", ping, accuracy=False, baseline=True),
    ]


# -- one run: N processes on one key -------------------------------------------------------

#: Round trips of this process (every send of redis-py's connections), once counting.
_trips = [0]


def count_round_trips() -> None:
    """Count every ``send_packed_command`` of redis-py's connections in this process:
    every contender talks to Redis through them (a command, or a pipeline, per call)."""
    from redis.connection import AbstractConnection

    original = AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        _trips[0] += 1
        original(self, command, check_health)

    AbstractConnection.send_packed_command = send  # type: ignore[method-assign]


@dataclass
class Run:
    seconds: float
    procs: int
    checks: int = 0
    trips: int = 0
    redis_cpu: float = 0.0
    #: (clock read before the call, after it) of every grant, time.time(); for a
    #: blocking acquire, the same shifted by the seconds to its slot.
    grants: list[tuple[float, float]] = field(default_factory=list)
    #: A blocking acquire: when each returned (when the caller's work would start).
    woke: list[tuple[float, float]] = field(default_factory=list)
    #: CPU seconds of the checking processes.
    client_cpu: float = 0.0
    errors: list[str] = field(default_factory=list)


def player(
    c: Contender, url: str, key: str, seconds: float, barrier: Any, out: Any
) -> None:  # pragma: no cover - runs in the forked processes
    try:
        check = c.make(url)
        check(f"{key}-warm")  # connection, scripts, first pass through the code
        count_round_trips()
        barrier.wait(30)
        grants: list[tuple[float, float]] = []
        woke: list[tuple[float, float]] = []
        checks = 0
        cpu = time.process_time()
        start = time.time()
        _trips[0] = 0
        end = start + seconds
        before = start
        while before < end:
            granted = check(key)
            after = time.time()
            checks += 1
            if c.blocking:
                # What acquire() does with its slot; the slot is at the server's
                # TIME, read between before and after, plus the delay.
                time.sleep(granted)
                if before + granted < end:  # (the last call may reserve past the end)
                    grants.append((before + granted, after + granted))
                    woke.append((time.time(), time.time()))
                after = time.time()
            elif granted and not c.baseline:
                grants.append((before, after))
            before = after
        cpu = time.process_time() - cpu
        out.put((checks, _trips[0], grants, woke, cpu, ""))
    except BaseException as exc:
        out.put((0, 0, [], [], 0.0, f"{type(exc).__name__}: {exc}"))


def run(c: Contender, url: str, admin: redis.Redis, procs: int, seconds: float) -> Run:
    admin.flushall()
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    key = f"bench-rate-{uuid.uuid4().hex[:8]}"
    children = [
        ctx.Process(target=player, args=(c, url, key, seconds, barrier, out), daemon=True)
        for _ in range(procs)
    ]
    cpu0 = server_cpu(admin)
    for p in children:
        p.start()
    result = Run(seconds, procs)
    for _ in children:
        checks, trips, grants, woke, cpu, error = out.get(timeout=60 + seconds)
        result.checks += checks
        result.trips += trips
        result.grants += grants
        result.woke += woke
        result.client_cpu += cpu
        if error:
            result.errors.append(error)
    for p in children:
        p.join(10)
    result.redis_cpu = server_cpu(admin) - cpu0
    result.grants.sort()
    return result


def server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# -- figures -----------------------------------------------------------------------------


def fullest_window(grants: list[tuple[float, float]], span: float = 1.0) -> tuple[int, int]:
    """(at least, at most) grants in the fullest half-open window ``[t, t + span)``,
    each grant known only to lie within its (before, after) span.

    *At least* counts the calls wholly inside a window: the fullest starts at
    some call's before, and (every call being shorter than ``span``) holds the
    calls that end before ``t + span`` less those that began before ``t``.
    *At most* counts the calls overlapping a window: the fullest starts at some
    call's after, and holds the calls that begin before ``t + span`` less those
    that ended before ``t``.
    """
    if not grants:
        return 0, 0
    befores = sorted(b for b, _ in grants)
    afters = sorted(a for _, a in grants)
    least = max(bisect_left(afters, t + span) - bisect_left(befores, t) for t in befores)
    most = max(bisect_left(befores, t + span) - bisect_left(afters, t) for t in afters)
    return least, most


def median(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def accuracy_rows(cs: list[Contender]) -> list[list[str]]:
    rows = []
    for c in cs:
        if not c.accuracy:
            continue
        errors = sorted({e for r in c.accuracy_runs for e in r.errors})
        if errors or not c.accuracy_runs:
            rows.append([c.label, "-", "-", "-", "-", "-", "; ".join(errors) or "not run"])
            continue
        runs = c.accuracy_runs
        views = [(c.label + (", its slot" if c.blocking else ""), [r.grants for r in runs])]
        if c.blocking:
            views.append((c.label + ", as it returns", [r.woke for r in runs]))
        for label, stamps in views:
            windows = [fullest_window(g) for g in stamps]
            least = max(w[0] for w in windows)
            most = max(w[1] for w in windows)
            granted = [len(g) / r.seconds for g, r in zip(stamps, runs)]
            rows.append([
                label,
                f"{min(granted):.1f}-{max(granted):.1f}",
                f"{least} / {most}" if least != most else str(least),
                f"{least / RATE:.2f}x",
                "no" if least <= RATE else f"yes, by {least - RATE}",
                ", ".join(str(w[0]) for w in windows),
            ])  # fmt: skip
    return rows


def work_rows(cs: list[Contender]) -> list[list[str]]:
    ours_row = next(c for c in cs if c.work and not c.baseline)
    base = next(c for c in cs if c.baseline)

    def rate(c: Contender) -> list[float]:
        return [r.checks / r.seconds for r in c.work_runs if not r.errors]

    def paired(c: Contender, other: Contender) -> Optional[float]:
        """Median over rounds of the two rates of the same round."""
        pairs = [
            (a.checks / a.seconds) / (b.checks / b.seconds)
            for a, b in zip(c.work_runs, other.work_runs)
            if a.checks and b.checks and not (a.errors or b.errors)
        ]
        return median(pairs)

    rows = []
    for c in cs:
        if not c.work:
            continue
        errors = sorted({e for r in c.work_runs for e in r.errors})
        rates = rate(c)
        if errors or not rates:
            rows.append([c.label, *["-"] * 6, "; ".join(errors) or "not run"])
            continue
        checks = sum(r.checks for r in c.work_runs)
        vs_ours, vs_ping = paired(c, ours_row), paired(c, base)
        grants = [fullest_window(r.grants)[0] for r in c.work_runs]
        rows.append([
            c.label,
            f"{median(rates):,.0f}",
            f"{vs_ours:.2f}x" if vs_ours else "-",
            f"{vs_ping:.2f}x" if vs_ping else "-",
            f"{sum(r.trips for r in c.work_runs) / checks:.2f}",
            f"{sum(r.redis_cpu for r in c.work_runs) / checks * 1e6:.1f}",
            f"{sum(r.client_cpu for r in c.work_runs) / checks * 1e6:.1f}",
            "-" if c.baseline else ", ".join(str(g) for g in grants),
        ])  # fmt: skip
    return rows


def backlog(base: str, runs: int) -> None:
    import rates_workers

    backlogs = rates_workers.run(base, runs)
    rate = int(import_module("rates_app").PER_SECOND)  # imported by the run, from BENCH_REDIS
    print(
        f"## Workers: {runs} runs of a task limited to {rate}/s sent at once to "
        f"{rates_workers.WORKERS} workers -P prefork -c {rates_workers.CONCURRENCY}\n"
    )
    print(table(rates_workers.HEADER, rates_workers.rows(backlogs, rate)))
    print(
        f"\nideal: (runs - 1) / {rate} = {(runs - 1) / rate:.2f} s from the first start to the "
        "last; messages per run: 1 is the run's own message, a deferred or retried run adds "
        "one per re-send.\n"
    )


# -- main ----------------------------------------------------------------------------------


def versions() -> str:
    found = []
    for p in PACKAGES:
        try:
            found.append(f"{p} {version(p)}")
        except PackageNotFoundError:
            found.append(f"{p} (not installed)")
    return ", ".join(found)


def primitives(url: str, admin: redis.Redis, args: argparse.Namespace) -> None:
    # The peers' imports happen here, once, before the forks.
    import celery_heimdall.task
    import dramatiq.rate_limits
    import limits.storage

    import celery_redislock

    del celery_heimdall, dramatiq, limits, celery_redislock
    cs = contenders()
    for r in range(args.rounds):
        order = cs[r % len(cs) :] + cs[: r % len(cs)]
        for c in order:
            if c.accuracy:
                c.accuracy_runs.append(run(c, url, admin, args.accuracy_procs, args.accuracy_s))
            if c.work:
                c.work_runs.append(run(c, url, admin, args.work_procs, args.work_s))
            last = c.accuracy_runs[-1] if c.accuracy else c.work_runs[-1]
            log(f"  round {r + 1}/{args.rounds} {c.label}: "
                f"{len(last.grants)} grants, {last.checks} checks"
                + (f", errors: {last.errors}" if last.errors else ""))  # fmt: skip

    print(
        f"## Accuracy: {args.accuracy_procs} processes check one limit of {RATE}/s "
        f"as fast as they can for {args.accuracy_s:g} s, {args.rounds} round(s)\n"
    )
    header = [
        "contender",
        "grants per s",
        "largest 1 s window (at least / at most)",
        "vs limit",
        "certainly over the limit",
        "at least, per round",
    ]
    print(table(header, accuracy_rows(cs)))
    print(
        "\n*at least*: grants whose whole call lies inside one half-open 1 s window; "
        "*at most*: calls that overlap it. A blocking acquire's slot is its call's span "
        "shifted by the seconds to the slot; as it returns, one clock read. "
        f"The limit is {RATE} in any 1 s window (burst 1: one more only at a window's "
        "closed edge).\n"
    )
    print(
        f"## Work: {args.work_procs} processes check one limit of {RATE}/s in a tight loop "
        f"for {args.work_s:g} s, {args.rounds} round(s)\n"
    )
    header = [
        "contender",
        "checks/s (median)",
        "vs celery_redislock",
        "vs PING",
        "round trips/check",
        "redis CPU µs/check",
        "client CPU µs/check",
        "largest 1 s window (at least), per round",
    ]
    print(table(header, work_rows(cs)))
    print()


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one round, shorter runs")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (2; --quick 1)")
    parser.add_argument("--accuracy-procs", type=int, default=4)
    parser.add_argument("--accuracy-s", type=float, default=None, help="seconds (3; --quick 2)")
    parser.add_argument("--work-procs", type=int, default=8)
    parser.add_argument("--work-s", type=float, default=None, help="seconds (2; --quick 1)")
    parser.add_argument(
        "--runs", type=int, default=None, help="backlog on workers (200; --quick 60)"
    )
    parser.add_argument("--no-workers", action="store_true", help="the primitives only")
    parser.add_argument("--no-primitives", action="store_true", help="the workers only")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.accuracy_s = args.accuracy_s or (2.0 if args.quick else 3.0)
    args.work_s = args.work_s or (1.0 if args.quick else 2.0)
    args.runs = args.runs or (60 if args.quick else 200)
    if min(args.rounds, args.accuracy_procs, args.work_procs, args.runs - 1) < 1:
        parser.error("--rounds and the process counts must be positive, --runs above 1")

    started = time.monotonic()
    server = private_server()
    try:
        admin = redis.Redis.from_url(server.url)
        print(
            f"redis-server {admin.info('server')['redis_version']} on loopback; Python "
            f"{platform.python_version()}; {versions()}; {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.2f} at start\n"
        )
        if not args.no_primitives:
            primitives(server.url, admin, args)
        admin.close()
        if not args.no_workers:
            backlog(server.url.rsplit("/", 1)[0], args.runs)
    finally:
        server.stop()
    print(
        f"Done in {time.monotonic() - started:.0f} s; "
        f"load average {os.getloadavg()[0]:.2f} at the end."
    )


if __name__ == "__main__":
    main()
