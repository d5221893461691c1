"""Handoff latency of this checkout's Lock against another revision's, batch by batch.

Runs ``bench/locks.py``'s handoff measurement (two processes playing
ping-pong with one lock; latency is the waiter's acquire-return time minus
the holder's release-call time) for two checkouts of celery_redislock on one
private redis-server, in interleaved batches (the two in rotating order, then
again), so that the machine's drift over a run falls on both alike.  The
other checkout is imported from its own ``src`` in the handoff players (this
process never imports celery_redislock), so any revision whose
``Lock(client, name, ttl=...)`` has blocking ``acquire()`` and ``release()``
can be compared::

    git worktree add /tmp/before <revision>
    python bench/revisions.py /tmp/before [--handoffs N] [--batches N]
        [--hold-ms MIN MAX] [--no-hiredis]
    python bench/revisions.py /tmp/before --task-overhead [--tasks N] [--rounds N]

Prints both medians and p99s and the ratio of this checkout's median to the
other's, batch by batch (the median of those ratios, and their range).
``--task-overhead`` compares LockedTask's per-task cost instead, round by
round (``bench/task_revisions.py``).  A benchmark, not a test: it never asserts.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

from common import ROOT, add_hold_ms, log, p99, private_server, split

HERE = str(ROOT / "src")


def _lock_from(src: str, client: Any, name: str) -> Any:
    """A Lock of the celery_redislock found in ``src`` (in a fresh handoff player)."""
    if sys.path[0] != src:
        sys.path.insert(0, src)
    from locks import TTL

    # Forked from a parent that imported this checkout's package (for its
    # private redis-server): forget it, so ``src``'s is imported here.
    for module in [m for m in sys.modules if m.split(".")[0] == "celery_redislock"]:
        del sys.modules[module]

    import celery_redislock

    if not str(celery_redislock.__file__).startswith(src):
        raise RuntimeError(f"celery_redislock came from {celery_redislock.__file__}, not {src}")
    return celery_redislock.Lock(client, name, ttl=TTL)


def source_dir(path: str) -> str:
    """The directory holding the ``celery_redislock`` package of checkout ``path``."""
    for candidate in (Path(path) / "src", Path(path)):
        if (candidate / "celery_redislock" / "__init__.py").is_file():
            return str(candidate.resolve())
    raise SystemExit(f"no celery_redislock package in {path} or {path}/src")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("other", help="a checkout of celery_redislock (or its src directory)")
    parser.add_argument("--handoffs", type=int, default=600, help="measured handoffs per checkout")
    parser.add_argument("--batches", type=int, default=15, help="interleaved batches")
    add_hold_ms(parser)
    parser.add_argument(
        "--no-hiredis", action="store_true", help="measure with redis-py's Python parser"
    )
    parser.add_argument(
        "--task-overhead",
        action="store_true",
        help="compare LockedTask's per-task cost instead (bench/task_revisions.py)",
    )
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per variant per round")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds")
    args = parser.parse_args(argv)
    low, high = args.hold_ms
    if args.batches < 1 or args.handoffs < args.batches or not 1 <= low <= high:
        parser.error("--handoffs at least --batches >= 1, and 1 <= --hold-ms MIN <= MAX")
    other = source_dir(args.other)
    if other == HERE:
        parser.error(f"{args.other} is this checkout")
    if args.task_overhead:
        from task_revisions import compare

        server = private_server()
        try:
            url = server.url.rsplit("/", 1)[0]
            labels = ["this checkout", f"other ({other})"]
            compare([HERE, other], labels, url, args.tasks, args.rounds)
        finally:
            server.stop()
        return
    if args.no_hiredis:
        sys.modules["hiredis"] = None  # type: ignore[assignment]  # before redis is imported

    # (Imported here, after the parser choice: the handoff players are forked.)
    import redis
    from locks import Contender, make_client, ms, run_handoffs

    checkouts = [
        Contender("this checkout", functools.partial(_lock_from, HERE)),
        Contender(f"other ({other})", functools.partial(_lock_from, other)),
    ]
    server = private_server()
    try:
        client = make_client(server.port)
        log(
            f"redis-server {client.info('server')['redis_version']}; redis-py "
            f"{redis.__version__}, hiredis {'off' if args.no_hiredis else 'if installed'}; "
            f"{args.handoffs} handoffs per checkout in {args.batches} batches, holder "
            f"releases {low:g}-{high:g} ms after the waiter calls acquire()"
        )
        hold = (low / 1000, high / 1000)
        latencies: list[list[float]] = [[], []]
        medians: list[list[float]] = [[], []]
        for b, n in enumerate(split(args.handoffs, args.batches)):
            for i in (0, 1) if b % 2 == 0 else (1, 0):
                name = f"bench:revisions:{i}:{b}"
                batch = [lat for lat, _, _ in run_handoffs(client, checkouts[i], name, n, hold)]
                latencies[i] += batch
                if batch:
                    medians[i].append(statistics.median(batch))
            log(f"  batch {b + 1}/{args.batches}")
        client.close()
    finally:
        server.stop()

    print("| checkout | handoffs | handoff median (ms) | handoff p99 (ms) |")
    print("|---|---:|---:|---:|")
    for c, values in zip(checkouts, latencies):
        if values:
            median = ms(statistics.median(values))
            print(f"| {c.label} | {len(values)} | {median} | {ms(p99(values))} |")
    ratios = [a / b for a, b in zip(*medians) if b]
    if ratios:
        print()
        print(
            f"This checkout's handoff over the other's, per batch ({len(ratios)} batches): "
            f"median ratio {statistics.median(ratios):.2f}x, "
            f"range {min(ratios):.2f}-{max(ratios):.2f}x"
        )


if __name__ == "__main__":
    main()
