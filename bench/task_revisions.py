"""LockedTask's per-task cost, this checkout's against another's, round by round.

The measurement of ``bench/task_cost.py`` (Celery's own tracer called in a
loop, as a pool child calls it per message: plain Celery, and LockedTask
with ``lock_key=["i"]``, never contended), run in one child process per
checkout, each importing celery_redislock from its own ``src``.  The parent
asks both for a round at a time, in alternating order, on one private
redis-server, and prints the task overhead (LockedTask's wall time per task
minus plain Celery's, measured in the same child and round) of each, and the
ratio of the two, round by round.  Run through ``bench/revisions.py DIR
--task-overhead``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import log

HERE = Path(__file__).resolve().parent


def serve(src: str) -> None:
    """The child: import celery_redislock from ``src``, then answer each line
    ``tasks first`` with the JSON ``[plain wall us, LockedTask wall us]``."""
    sys.path.insert(0, src)
    sys.path.insert(1, str(HERE))
    import bench_app
    import redis
    from celery.app.trace import build_tracer
    from task_cost import measure

    import celery_redislock

    if not str(celery_redislock.__file__).startswith(src):
        raise RuntimeError(f"celery_redislock came from {celery_redislock.__file__}, not {src}")
    app = bench_app.app
    app.finalize()
    admin = redis.Redis.from_url(os.environ["BENCH_REDIS"])
    tracers = [
        build_tracer(task.name, task, app=app, hostname="bench@local")
        for task in (bench_app.plain_noop, bench_app.locked_noop)
    ]
    for line in sys.stdin:
        n, first = (int(x) for x in line.split())
        walls = [measure(tracer, n, first + i * n, admin)[0] for i, tracer in enumerate(tracers)]
        print(json.dumps(walls), flush=True)


def compare(srcs: list[str], labels: list[str], url: str, tasks: int, rounds: int) -> None:
    """Rounds of ``tasks`` tasks per variant in each checkout's child; prints the table."""
    env = {**os.environ, "BENCH_REDIS": url}
    children = [
        subprocess.Popen(
            [sys.executable, __file__, src],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(HERE),
        )
        for src in srcs
    ]
    # Each child's task ids start apart, so no two runs share a lock name.
    first = [0, 10**9]

    def ask(i: int, n: int) -> Any:
        child = children[i]
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(f"{n} {first[i]}\n")
        child.stdin.flush()
        first[i] += 2 * n
        return json.loads(child.stdout.readline())

    overheads: list[list[float]] = [[], []]
    try:
        for i in (0, 1):
            ask(i, 200)  # warm-up: imports, connections, scripts, threads
        for r in range(rounds):
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                plain, locked = ask(i, tasks)
                overheads[i].append(locked - plain)
            log(f"  round {r + 1}/{rounds}")
    finally:
        for child in children:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(30)
    print("| checkout | rounds | task overhead median (us/task) | range |")
    print("|---|---:|---:|---|")
    for label, values in zip(labels, overheads):
        print(
            f"| {label} | {len(values)} | {statistics.median(values):.0f} "
            f"| {min(values):.0f}-{max(values):.0f} |"
        )
    ratios = [a / b for a, b in zip(*overheads) if b > 0]
    if ratios:
        print()
        print(
            f"This checkout's task overhead over the other's, per round ({len(ratios)} rounds): "
            f"median ratio {statistics.median(ratios):.2f}x, "
            f"range {min(ratios):.2f}-{max(ratios):.2f}x"
        )


if __name__ == "__main__":
    serve(sys.argv[1])
