"""Task benchmark: LockedTask against plain Celery and its peers, on real workers.

Starts one private redis-server (locks on db 0, broker on db 1, results on
db 2, body records on db 3) and one ``celery worker -P prefork -c 4``
subprocess that serves every variant, then prints two tables:

1. Overhead.  N distinct no-op tasks (distinct arguments, so no contention)
   per variant: plain Celery, plain Celery whose body sends two bare PINGs
   to the lock store (the floor of any lock taken and released in the
   worker: one round trip each), LockedTask with ``lock_key`` on the
   argument, celery-singleton, celery-once and celery-heimdall.  Time is wall time
   from the first submit to the last result stored (submit all, then poll
   the stored results with MGET: ``AsyncResult.get`` would cost this
   process ~1 ms of CPU per task, taken from the worker it is timing).
   Every variant runs ROUNDS times, interleaved (each round starts at a
   different variant).  Two ratios against plain Celery: best run against
   best run (other processes can only add time), and the median over rounds
   of the ratio within each round (rounds run back to back, so a slow
   stretch of the machine hits both sides; the steadier figure).  Worker
   CPU gets the same per-round ratio.  CPU time per task is summed over the rounds for the
   worker (main process and pool children, from /proc), redis-server (INFO
   cpu) and this process (submitting and waiting); on a machine with fewer
   cores than busy processes, wall time follows CPU time, and CPU time is
   far less disturbed by other load.  A separate untimed pass counts the
   Redis requests per task by process and db under MONITOR.
   celery-heimdall with its default ``unique_lock_blocking=True`` makes every
   run wait a full second for the lock its own ``apply_async`` took, so it
   runs once with a few tasks and is compared per task.

2. Duplicates.  D copies of one 0.3 s task with the same arguments, per
   LockedTask policy (skip, retry, wait, fail, park), celery-singleton, celery-once,
   celery-heimdall and plain Celery.  Bodies record their start and end in
   Redis; the table shows how many bodies ran, their peak overlap, the drain
   time (first submit to the last result settled) and its ratio to the ideal
   serial time (bodies x 0.3 s).

A benchmark, not a test: it never asserts, it reports.  Run from anywhere:

    python bench/tasks.py [--tasks N] [--rounds N] [--duplicates N] [--overhead-only] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Optional

import redis
from common import private_server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONCURRENCY = 4
#: Rounds of the overhead measurement; the table shows the best and the median.
ROUNDS = 7
#: Tasks per variant in the unmeasured warm-up (imports, connections, Lua scripts).
WARMUP = 50
#: Tasks for celery-heimdall's default configuration (a 1 s wait per task).
HEIMDALL_BLOCKING_TASKS = 40
#: Tasks per variant in the (untimed) pass that counts requests under MONITOR.
TRIPS_TASKS = 100


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- processes -----------------------------------------------------------------


class Worker:
    """``celery -A bench_app worker -P prefork -c 4``; ``stop()`` sends SIGTERM then SIGKILL."""

    def __init__(self, base_url: str, prefetch: int, app: str = "bench_app") -> None:
        self.log = Path(tempfile.mkstemp(prefix="redislock-bench-worker-", suffix=".log")[1])
        env = dict(
            os.environ,
            BENCH_REDIS=base_url,
            BENCH_PREFETCH=str(prefetch),
            PYTHONPATH=os.pathsep.join(
                [
                    str(ROOT),
                    str(HERE),
                    *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
                ]
            ),
        )
        cmd = [
            sys.executable, "-m", "celery", "-A", app, "worker",
            "-P", "prefork", "-c", str(CONCURRENCY), "-n", "bench@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-l", "WARNING",
        ]  # fmt: skip
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the pool children, if any remain
        self.proc.wait(5)
        self._out.close()
        self.log.unlink(missing_ok=True)


# -- measurement helpers -------------------------------------------------------


def settle(results: list[Any], timeout: float) -> list[Any]:
    """Wait for every result; return each one's value or exception, never raise."""
    deadline = time.monotonic() + timeout
    values = []
    for r in results:
        try:
            values.append(r.get(timeout=max(0.1, deadline - time.monotonic()), propagate=False))
        except Exception as exc:  # a timeout or a broken result backend: report it
            values.append(exc)
    return values


def wait_stored(app: Any, results: list[Any], timeout: float) -> list[Any]:
    """Like :func:`settle`, for many results at little cost to this process.

    ``AsyncResult.get`` subscribes and unsubscribes per result: ~1 ms of this
    process's CPU per task, on the same 2 cores as the worker being timed.
    This polls the stored results instead (MGET, every few ms), so nearly all
    CPU goes to the worker, and the time still ends when the last result is
    stored (to within the poll interval).
    """
    backend = app.backend
    client = backend.client
    deadline = time.monotonic() + timeout
    keys = {r.id: backend.get_key_for_task(r.id) for r in results}
    stored: dict[str, Any] = {}
    waiting = [r.id for r in results]
    while waiting and time.monotonic() < deadline:
        still = []
        for i in range(0, len(waiting), 1000):
            chunk = waiting[i : i + 1000]
            for task_id, raw in zip(chunk, client.mget([keys[t] for t in chunk])):
                if raw is None:
                    still.append(task_id)
                else:
                    stored[task_id] = raw
        waiting = still
        if waiting:
            time.sleep(0.003)
    values: list[Any] = []
    for r in results:
        raw = stored.get(r.id)
        if raw is None:
            values.append(TimeoutError(f"no result for {r.id} within {timeout} s"))
            continue
        meta = backend.decode_result(raw)
        values.append(meta["result"] if meta["status"] == "SUCCESS" else meta)
    return values


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = current = 0
    for _, step in events:  # an end sorts before a start at the same instant
        current += step
        peak = max(peak, current)
    return peak


def fmt_seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


# -- 1. overhead -----------------------------------------------------------------


@dataclass
class Overhead:
    label: str
    task: Any
    times: list[float] = field(default_factory=list)
    #: Worker CPU seconds of each measured round (for per-round ratios).
    worker_cpus: list[float] = field(default_factory=list)
    #: CPU seconds, summed over the measured rounds.
    worker_cpu: float = 0.0
    redis_cpu: float = 0.0
    client_cpu: float = 0.0
    tasks_run: int = 0
    errors: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def best(self) -> Optional[float]:
        return min(self.times) if self.times else None

    @property
    def median(self) -> Optional[float]:
        return statistics.median(self.times) if self.times else None

    def paired(self, base: Overhead, worker_cpu: bool = False) -> Optional[float]:
        """Median over rounds of this variant's wall (or worker CPU) over ``base``'s in
        the same round: rounds run back to back, so a slow stretch of the machine
        hits both sides of each ratio."""
        mine, theirs = (
            (self.worker_cpus, base.worker_cpus) if worker_cpu else (self.times, base.times)
        )
        ratios = [a / b for a, b in zip(mine, theirs) if b > 0]
        return statistics.median(ratios) if ratios else None

    def per_task(self, seconds: float) -> float:
        """``seconds`` (summed over rounds) per task, in ms."""
        return seconds / max(1, self.tasks_run) * 1000


#: Seconds to wait after a batch's last result before reading the worker's CPU time.
SETTLE = 0.5


def tree_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants (Linux /proc)."""
    ticks, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
            ticks += int(stat[11]) + int(stat[12])  # utime, stime (fields 14 and 15)
            with open(f"/proc/{p}/task/{p}/children", "rb") as f:
                stack += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Bench:
    def __init__(self, app_module: Any, admin: redis.Redis, worker_pid: int) -> None:
        self.m = app_module
        self.admin = admin
        self.worker_pid = worker_pid
        self.trips: dict[str, tuple[int, Counter[str]]] = {}
        self.locks = redis.Redis.from_url(app_module.LOCK_URL)
        self.records = redis.Redis.from_url(app_module.RECORD_URL)
        self.offset = 0

    def clean(self) -> None:
        """Drop lock and record keys between runs (results and messages are all consumed)."""
        self.locks.flushdb()
        self.records.flushdb()

    def overhead_run(self, v: Overhead, n: int, timeout: float, measure: bool = True) -> None:
        self.clean()
        first, self.offset = self.offset, self.offset + n
        cpu_before = (tree_cpu(self.worker_pid), server_cpu(self.admin), time.process_time())
        started = time.perf_counter()
        try:
            results = [v.task.apply_async((first + i,)) for i in range(n)]
        except Exception as exc:
            v.errors.append(f"submit failed: {type(exc).__name__}: {exc}")
            return
        values = wait_stored(self.m.app, results, timeout)
        elapsed = time.perf_counter() - started
        # The last results are stored before the worker has finished with their
        # messages (acks, the pool handing results back): let it, or that work
        # is charged to the next variant (about 8% in an A/A check).
        time.sleep(SETTLE)
        cpu_after = (tree_cpu(self.worker_pid), server_cpu(self.admin), time.process_time())
        bad = [(i, val) for i, val in enumerate(values) if val != first + i]
        if bad:
            i, val = bad[0]
            v.errors.append(f"{len(bad)}/{n} wrong results, e.g. #{i}: {val!r}")
            return
        if measure:
            v.times.append(elapsed)
            v.worker_cpus.append(cpu_after[0] - cpu_before[0])
            v.worker_cpu += cpu_after[0] - cpu_before[0]
            v.redis_cpu += cpu_after[1] - cpu_before[1]
            v.client_cpu += cpu_after[2] - cpu_before[2]
            v.tasks_run += n

    def overhead(self, n: int, rounds: int, heimdall_n: int) -> list[Overhead]:
        m = self.m
        variants = [
            Overhead("plain Celery", m.plain_noop),
            Overhead("plain Celery + 2 PINGs in the body (floor)", m.two_pings_noop),
            Overhead("LockedTask, lock_key=['i']", m.locked_noop),
            Overhead("celery-singleton", m.singleton_noop),
            Overhead("celery-once", m.once_noop),
            Overhead("celery-heimdall, unique_lock_blocking=False", m.heimdall_nb_noop),
        ]
        timeout = 60 + n * 0.05
        for v in variants:
            self.overhead_run(v, WARMUP, timeout, measure=False)
        for r in range(rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                if not v.errors:
                    self.overhead_run(v, n, timeout)
            log(f"  overhead round {r + 1}/{rounds}: " + ", ".join(
                f"{v.label.split(',')[0]} {v.times[-1]:.2f}s" for v in variants if v.times
            ))  # fmt: skip
        # Round trips, in a separate pass: MONITOR slows the server, so nothing is timed.
        for v in variants:
            if v.errors:
                continue
            monitor = CommandLog(self.m.LOCK_URL)
            probe = Overhead(v.label, v.task)
            self.overhead_run(probe, TRIPS_TASKS, timeout, measure=False)
            roles = local_ports(process_roles(self.worker_pid))
            monitor.stop(self.admin)
            self.trips[v.label] = (TRIPS_TASKS, round_trips(monitor.commands, roles))
        blocking = Overhead(
            "celery-heimdall, defaults",
            m.heimdall_noop,
            note=(
                f"{heimdall_n} tasks, 1 round: with unique_lock_blocking=True (its default) "
                "every run blocks 1 s (unique_lock_timeout) on the lock its own apply_async "
                "took, then runs anyway; the full N would take N/4 seconds"
            ),
        )
        self.overhead_run(blocking, heimdall_n, 30 + heimdall_n * 1.5)
        log(f"  heimdall defaults: {fmt_seconds(blocking.median)} s for {heimdall_n} tasks")
        return [*variants, blocking]


def overhead_table(rows: list[Overhead], rounds: int) -> str:
    base = rows[0]
    base_wall = base.best / (base.tasks_run // len(base.times)) if base.best else None
    base_cpu = (
        base.per_task(base.worker_cpu + base.redis_cpu + base.client_cpu)
        if base.tasks_run
        else None
    )
    out = []
    for v in rows:
        if v.errors or v.best is None:
            out.append([v.label, "-", "-", "-", "-", "-", "-", "-", "; ".join(v.errors) or "-"])
            continue
        count = v.tasks_run // len(v.times)
        wall = v.best / count
        cpu = v.per_task(v.worker_cpu + v.redis_cpu + v.client_cpu)
        paired_wall = v.paired(base) if v.worker_cpus else None
        paired_cpu = v.paired(base, worker_cpu=True) if v.worker_cpus else None
        out.append([
            v.label + (" *" if v.note else ""),
            str(count),
            f"{v.best:.3f}",
            f"{v.median:.3f}" if len(v.times) > 1 else "-",
            f"{wall / base_wall:.2f}x" if base_wall else "-",
            f"{paired_wall:.2f}x" if paired_wall and count == base.tasks_run // len(base.times)
            else "-",
            f"{v.per_task(v.worker_cpu):.2f}",
            f"{paired_cpu:.2f}x" if paired_cpu and count == base.tasks_run // len(base.times)
            else "-",
            f"{v.per_task(v.redis_cpu):.2f}",
            f"{v.per_task(v.client_cpu):.2f}",
            f"{cpu / base_cpu:.2f}x" if base_cpu else "-",
        ])  # fmt: skip
    header = [
        "variant", "tasks", f"wall s, best of {rounds}", "median s", "wall vs plain (best)",
        "wall vs plain (median of rounds)", "worker CPU ms/task",
        "worker CPU vs plain (median of rounds)", "redis CPU ms/task", "client CPU ms/task",
        "CPU vs plain",
    ]  # fmt: skip
    notes = [f"\\* {v.note}" for v in rows if v.note]
    return table(header, out) + "".join("\n\n" + n for n in notes)


DB_NAMES = {0: "locks", 1: "broker", 2: "results", 3: "records"}
#: Commands of the benchmark's own bookkeeping, not of the task path.
BOOKKEEPING = {"INFO", "ECHO", "FLUSHDB", "MONITOR", "LRANGE", "RPUSH", "INCR", "PING"}


def local_ports(pids: dict[int, str]) -> dict[int, str]:
    """Local TCP port -> role, for every socket the processes ``pids`` hold (Linux /proc)."""
    inode_port = {}
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table_path) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                inode_port[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
    ports = {}
    for pid, role in pids.items():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inode_port:
                ports[inode_port[link[8:-1]]] = role
    return ports


def process_roles(worker_pid: int) -> dict[int, str]:
    roles = {os.getpid(): "client", worker_pid: "worker main"}
    with open(f"/proc/{worker_pid}/task/{worker_pid}/children", "rb") as f:
        roles.update({int(c): "worker child" for c in f.read().split()})
    return roles


class CommandLog:
    """Every command the server receives, through MONITOR, until ``stop()``."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.marker = f"bench-monitor-stop-{uuid.uuid4().hex}"
        self.commands: list[dict[str, Any]] = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        with self.client.monitor() as m:
            self.ready.set()
            for cmd in m.listen():
                if cmd["command"] == f"ECHO {self.marker}":
                    return
                self.commands.append(cmd)

    def stop(self, admin: redis.Redis) -> None:
        admin.echo(self.marker)
        self.thread.join(30)
        self.client.close()


def round_trips(commands: list[dict[str, Any]], ports: dict[int, str]) -> Counter[str]:
    """Requests by "role -> db": MULTI ... EXEC counts once, Lua-internal calls not at all."""
    counts: Counter[str] = Counter()
    in_multi: set[str] = set()
    for c in commands:
        if c["client_type"] != "tcp":
            continue  # "lua": a call inside a script, not a request
        name = c["command"].split(" ", 1)[0].upper()
        if name in BOOKKEEPING:
            continue
        conn = c["client_port"]
        if name == "MULTI":
            in_multi.add(conn)
            continue
        if conn in in_multi and name != "EXEC":
            continue
        in_multi.discard(conn)
        role = ports.get(int(conn), "other")
        counts[f"{role} -> {DB_NAMES.get(c['db'], c['db'])}"] += 1
    return counts


def trips_table(trips: dict[str, tuple[int, Counter[str]]]) -> str:
    columns = sorted({k for _, c in trips.values() for k in c})
    rows = []
    for label, (n, counts) in trips.items():
        rows.append(
            [label]
            + [f"{counts[k] / n:.2f}" if counts[k] else "-" for k in columns]
            + [f"{sum(counts.values()) / n:.2f}"]
        )
    return table(["variant", *columns, "total"], rows)


# -- 2. duplicates ----------------------------------------------------------------


@dataclass
class Duplicates:
    label: str
    task: Any
    bodies: int = 0
    peak: int = 0
    drain: Optional[float] = None
    outcomes: Counter[str] = field(default_factory=Counter)
    contended: int = 0
    error: str = ""


def classify(submitted_id: str, result: Any, value: Any) -> str:
    from celery.result import EagerResult

    if isinstance(result, EagerResult):
        return f"refused at submit ({result.state})"
    if result.id != submitted_id:
        return "deduplicated at submit"
    if isinstance(value, BaseException):
        name = type(value).__name__
        return {"TaskSkipped": "skipped", "LockContended": "failed LockContended"}.get(
            name, f"error {name}"
        )
    return "ran" if value == "ran" else f"returned {value!r}"


def duplicates_run(bench: Bench, v: Duplicates, d: int) -> None:
    bench.clean()
    tag = f"{v.task.name.rsplit('.', 1)[1]}-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    try:
        ids = [uuid.uuid4().hex for _ in range(d)]
        results = [v.task.apply_async((tag, tag), task_id=i) for i in ids]
    except Exception as exc:
        v.error = f"submit failed: {type(exc).__name__}: {exc}"
        return
    values = settle(results, 60 + d * bench.m.DUP_SECONDS * 2)
    v.drain = time.perf_counter() - started
    for i, r, val in zip(ids, results, values):
        v.outcomes[classify(i, r, val)] += 1
    runs = [json.loads(x) for x in bench.records.lrange(f"runs:{tag}", 0, -1)]
    v.bodies = len(runs)
    v.peak = peak_overlap([(x["start"], x["end"]) for x in runs])
    v.contended = int(bench.records.get(f"contended:{tag}") or 0)


def duplicates(bench: Bench, d: int) -> list[Duplicates]:
    m = bench.m
    variants = [
        Duplicates("plain Celery", m.plain_dup),
        Duplicates("LockedTask skip", m.locked_dup_skip),
        Duplicates("LockedTask retry", m.locked_dup_retry),
        Duplicates("LockedTask wait", m.locked_dup_wait),
        Duplicates("LockedTask fail", m.locked_dup_fail),
        Duplicates("LockedTask park", m.locked_dup_park),
        Duplicates("celery-singleton", m.singleton_dup),
        Duplicates("celery-once (graceful)", m.once_dup),
        Duplicates("celery-heimdall (unique, non-blocking)", m.heimdall_nb_dup),
    ]
    for v in variants:
        duplicates_run(bench, v, d)
        log(f"  duplicates {v.label}: {fmt_seconds(v.drain)} s, {v.bodies} bodies")
    return variants


def duplicates_table(rows: list[Duplicates], seconds: float) -> str:
    out = []
    for v in rows:
        if v.error or v.drain is None:
            out.append([v.label, "-", "-", "-", "-", "-", "-", v.error])
            continue
        ideal = v.bodies * seconds
        ratio = f"{v.drain / ideal:.2f}x" if ideal else "-"
        outcomes = ", ".join(f"{c} {k}" for k, c in sorted(v.outcomes.items(), key=lambda x: -x[1]))
        out.append([
            v.label, str(v.bodies), str(v.peak), f"{v.drain:.3f}", f"{ideal:.1f}", ratio,
            str(v.contended) if v.label.startswith("LockedTask") else "-", outcomes,
        ])  # fmt: skip
    header = [
        "variant", "bodies run", "peak overlap", "drain s", "ideal s", "drain/ideal",
        "contended tries", "outcomes",
    ]  # fmt: skip
    return table(header, out)


# -- main ----------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=None, help="tasks per overhead run (1000)")
    parser.add_argument("--duplicates", type=int, default=None, help="duplicates per variant (20)")
    parser.add_argument(
        "--quick", action="store_true", help="200 tasks, 1 round, 8 duplicates: a smoke run"
    )
    parser.add_argument(
        "--prefetch", type=int, default=4, help="worker_prefetch_multiplier (Celery's default 4)"
    )
    parser.add_argument("--rounds", type=int, default=None, help=f"overhead rounds ({ROUNDS})")
    parser.add_argument("--overhead-only", action="store_true", help="skip the duplicates table")
    args = parser.parse_args(argv)
    n = args.tasks or (200 if args.quick else 1000)
    d = args.duplicates or (8 if args.quick else 20)
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    heimdall_n = min(n, 8 if args.quick else HEIMDALL_BLOCKING_TASKS)
    if n < 1 or d < 1 or args.prefetch < 1 or rounds < 1:
        parser.error("--tasks, --duplicates, --rounds and --prefetch must be positive")

    total = time.perf_counter()
    server = private_server()
    base_url = server.url.rsplit("/", 1)[0]
    os.environ["BENCH_REDIS"] = base_url  # read by bench_app at import
    os.environ["BENCH_PREFETCH"] = str(args.prefetch)
    sys.path.insert(0, str(HERE))
    worker = None
    try:
        import bench_app

        import celery_redislock

        admin = redis.Redis.from_url(server.url)
        worker = Worker(base_url, args.prefetch)
        bench = Bench(bench_app, admin, worker.proc.pid)
        ready = bench_app.plain_noop.apply_async((0,))
        try:
            ready.get(timeout=60)
        except Exception:
            log(worker.output())
            raise
        libs = ", ".join(
            f"{p} {version(p)}"
            for p in ("celery", "celery-redislock", "celery-singleton", "celery_once",
                      "celery-heimdall")
        )  # fmt: skip
        print(
            f"redis-server {admin.info('server')['redis_version']} on {base_url}; "
            f"Python {platform.python_version()}, redis-py {redis.__version__}, {libs}; "
            f"{os.cpu_count()} CPUs; worker -P prefork -c {CONCURRENCY}, "
            f"prefetch multiplier {args.prefetch}, log level WARNING; celery_redislock from "
            f"{Path(celery_redislock.__file__).parent}; load average {load()} at start\n"
        )

        log(f"overhead: {n} distinct no-op tasks per variant, {rounds} round(s)")
        rows = bench.overhead(n, rounds, heimdall_n)
        print(f"## Overhead: {n} distinct no-op tasks, submit all then wait for all\n")
        print(overhead_table(rows, rounds))
        print(
            f"\nRedis requests per task, by process and db ({TRIPS_TASKS} more tasks per variant "
            "under MONITOR; a MULTI/EXEC block counts once, commands inside Lua not at all):\n"
        )
        print(trips_table(bench.trips))

        if not args.overhead_only:
            log(f"duplicates: {d} copies of a {bench_app.DUP_SECONDS} s task per variant")
            dup_rows = duplicates(bench, d)
            print(
                f"\n## Duplicates: {d} copies of one {bench_app.DUP_SECONDS} s task (same args)\n"
            )
            print(duplicates_table(dup_rows, bench_app.DUP_SECONDS))
        print(f"\ntotal run time {time.perf_counter() - total:.0f} s; load average {load()} at end")
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


if __name__ == "__main__":
    main()
