"""Per-task cost of LockedTask inside one process, through Celery's own tracer.

bench/tasks.py times whole workers, where scheduling on a 2-core machine
swings one 1000-task round of the same variant by +-30%.  This script calls
what a prefork pool child calls for every message (the tracer of
``celery.app.trace.build_tracer``) in a loop in this one process, so the
marginal cost of taking and releasing a lock shows with little noise:

* plain Celery: the tracer, the no-op body, and storing the result (one
  round trip to the result backend);
* plain Celery + 2 PINGs: the same body plus two bare PINGs to the lock
  store, the floor of any lock taken and released in the worker;
* LockedTask with ``lock_key=["i"]``: distinct ``i``, so never contended.

Reported per task: wall time and CPU time of this process (wall includes
waiting for Redis), and redis-server CPU (INFO cpu).  Variants run in
interleaved rounds; the table shows the median round.  A benchmark, not a
test: it never asserts.

    python bench/task_cost.py [--tasks N] [--rounds N]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import redis
from common import log, private_server, tasks_and_rounds

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def measure(
    tracer: Callable[..., Any], n: int, first: int, admin: redis.Redis
) -> tuple[float, ...]:
    """(wall us, CPU us, redis CPU us) per task over ``n`` traced calls."""
    server = admin.info("cpu")
    server_before = float(server["used_cpu_user"]) + float(server["used_cpu_sys"])
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(first, first + n):
        task_id = str(uuid.uuid4())
        request = {"id": task_id, "hostname": "bench@local", "delivery_info": {}}
        tracer(task_id, (i,), {}, request)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    server = admin.info("cpu")
    server_cpu = float(server["used_cpu_user"]) + float(server["used_cpu_sys"]) - server_before
    return wall / n * 1e6, cpu / n * 1e6, server_cpu / n * 1e6


def main(argv: Optional[list[str]] = None) -> None:
    args = tasks_and_rounds(
        __doc__, argv, 2000, "tasks per variant per round", "interleaved rounds"
    )

    server = private_server()
    try:
        os.environ["BENCH_REDIS"] = server.url.rsplit("/", 1)[0]  # read by bench_app
        sys.path.insert(0, str(HERE))
        import bench_app
        from celery.app.trace import build_tracer

        app = bench_app.app
        app.finalize()
        admin = redis.Redis.from_url(server.url)
        variants = [
            ("plain Celery", bench_app.plain_noop),
            ("plain Celery + 2 PINGs in the body (floor)", bench_app.two_pings_noop),
            ("LockedTask, lock_key=['i']", bench_app.locked_noop),
        ]
        tracers = {
            label: build_tracer(task.name, task, app=app, hostname="bench@local")
            for label, task in variants
        }
        log(
            f"{args.tasks} tasks x {args.rounds} rounds per variant; "
            f"load average {'/'.join(f'{x:.1f}' for x in os.getloadavg())}"
        )
        samples: dict[str, list[tuple[float, ...]]] = {label: [] for label, _ in variants}
        first = 0
        for label, _ in variants:  # warm-up: imports, connections, scripts, threads
            measure(tracers[label], 200, first, admin)
            first += 200
        for r in range(args.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for label, _ in order:
                samples[label].append(measure(tracers[label], args.tasks, first, admin))
                first += args.tasks
            log(f"  round {r + 1}/{args.rounds}")

        med = {
            label: tuple(statistics.median(s[k] for s in rows) for k in range(3))
            for label, rows in samples.items()
        }
        plain, floor = med["plain Celery"], med[variants[1][0]]
        print(
            "| variant | wall us/task | CPU us/task | redis CPU us/task "
            "| added wall vs plain | added CPU (this process + redis) vs plain "
            "| added CPU vs floor |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, (wall, cpu, rcpu) in med.items():
            added = cpu + rcpu - plain[1] - plain[2]
            over_floor = cpu + rcpu - floor[1] - floor[2]
            print(
                f"| {label} | {wall:.0f} | {cpu:.0f} | {rcpu:.0f} | {wall - plain[0]:+.0f} "
                f"| {added:+.0f} | {over_floor:+.0f} |"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
