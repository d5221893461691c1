"""Floor benchmark: what a Redis command costs a no-op Celery task, and where.

The task overhead goal (bench/tasks.py) compares LockedTask with plain Celery
on no-op tasks.  This asks what any lock taken and released through Redis
in the worker must cost there, by timing, on one worker, in one run, with
the method of bench/tasks.py (interleaved rounds, median of per-round
ratios against plain Celery):

- plain Celery;
- one / two bare PINGs on a raw socket from the pool child (no client
  library: the cheapest command there is);
- one PING sent as the tracer starts the run, its reply read in the body
  (does overlapping the round trip with the tracer's work hide it?);
- LockedTask (acquire and release from the pool child);
- LockedTask with acquire and release done by the worker's main process on
  its event loop, batched per loop iteration: the pool child touches Redis
  not at all (a prototype, see floor_app.py).

CPU is read from /proc for the worker's main process and the pool children,
and from INFO for redis-server.  A benchmark, not a test: it never asserts.

    python bench/floor.py [--tasks N] [--rounds N]
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tasks as bench  # noqa: E402  (bench/tasks.py: server, worker, rounds)
from common import tasks_and_rounds  # noqa: E402


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` alone."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read().rsplit(b")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: Optional[list[str]] = None) -> None:
    args = tasks_and_rounds(__doc__, argv, 1000, "tasks per round (1000)", "rounds per variant (7)")

    server = bench.start_server()
    base_url = server.url.rsplit("/", 1)[0]
    os.environ["BENCH_REDIS"] = base_url  # read by bench_app at import
    worker = None
    try:
        import bench_app
        import floor_app

        admin = redis.Redis.from_url(server.url)
        locks = redis.Redis.from_url(bench_app.LOCK_URL)
        worker = bench.Worker(base_url, 4, app="floor_app")
        runner = bench.Bench(bench_app, admin, worker.proc.pid)
        bench_app.plain_noop.apply_async((0,)).get(timeout=60)
        variants = [
            bench.Overhead("plain Celery", bench_app.plain_noop),
            bench.Overhead("1 raw PING in the child", floor_app.raw1_noop),
            bench.Overhead("2 raw PINGs in the child", floor_app.raw2_noop),
            bench.Overhead("1 raw PING, sent at tracer start", floor_app.early_noop),
            bench.Overhead("LockedTask (child acquires, releases)", bench_app.locked_noop),
            bench.Overhead("LockedTask, lock ops in the main process", floor_app.mainloop_noop),
        ]
        main_cpu: dict[str, list[float]] = {v.label: [] for v in variants}
        redis_cpu: dict[str, list[float]] = {v.label: [] for v in variants}
        leftovers: dict[str, int] = {v.label: 0 for v in variants}
        print(
            f"redis-server {admin.info('server')['redis_version']}; Python "
            f"{platform.python_version()}; {os.cpu_count()} CPUs; worker -P prefork -c "
            f"{bench.CONCURRENCY}; {args.tasks} no-op tasks per round, {args.rounds} rounds; "
            f"load average {bench.load()} at start\n"
        )
        timeout = 60 + args.tasks * 0.05
        for v in variants:
            runner.overhead_run(v, bench.WARMUP, timeout, measure=False)
        for r in range(args.rounds):
            for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
                before = process_cpu(worker.proc.pid), bench.server_cpu(admin)
                runner.overhead_run(v, args.tasks, timeout)
                main_cpu[v.label].append(process_cpu(worker.proc.pid) - before[0])
                redis_cpu[v.label].append(bench.server_cpu(admin) - before[1])
                # Locks left held after every run ended (there should be none).
                leftovers[v.label] += sum(1 for _ in locks.scan_iter("redislock:*:lock"))
            bench.log(f"  round {r + 1}/{args.rounds}: " + ", ".join(
                f"{v.times[-1]:.2f}s" for v in variants if v.times
            ))  # fmt: skip

        base = variants[0]
        rows = []
        for v in variants:
            if v.errors or not v.times:
                rows.append([v.label, *["-"] * 7, "; ".join(v.errors)])
                continue
            n = v.tasks_run / len(v.times)
            rows.append([
                v.label,
                f"{statistics.median(v.times):.3f}",
                f"{v.paired(base):.3f}x",
                f"{v.paired(base, worker_cpu=True):.3f}x",
                f"{v.per_task(v.worker_cpu) * 1000:.0f}",
                f"{statistics.median(main_cpu[v.label]) / n * 1e6:.0f}",
                f"{statistics.median(redis_cpu[v.label]) / n * 1e6:.0f}",
                str(leftovers[v.label]),
                "",
            ])  # fmt: skip
        header = [
            "variant", "wall s (median)", "wall vs plain", "worker CPU vs plain",
            "worker CPU µs/task", "of it main process", "redis CPU µs/task",
            "locks left held", "errors",
        ]  # fmt: skip
        print(bench.table(header, rows))
        print(
            "\nRatios: median over rounds of the ratio to plain Celery in the same round. "
            f"Load average {bench.load()} at end."
        )
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    bench.log(f"total {time.perf_counter() - started:.0f} s")
