"""The transport's mirrored pool checkout against redis-py's ``get_connection()``, on a hand-over.

The transport takes a connection from a plain ``redis.ConnectionPool`` in
its own steps (:mod:`celery_redislock.transport._checkout`), switchable in
the process (``_checkout.MIRRORED``).  This runs ``bench/locks.py``'s
hand-over measurement (two processes playing ping-pong with one Lock;
latency is the waiter's acquire-return time minus the holder's release-call
time) with the mirrored checkout and with ``pool.get_connection()``, in
interleaved batches (the two in rotating order, then again) on one private
redis-server, and prints the mirrored median over the other's, batch by
batch (the median of those ratios, and their range).  The step earns its
place at 0.90x or less.  A benchmark, not a test: it never asserts.

    python bench/transport_paths.py [--handoffs N] [--batches N] [--hold-ms MIN MAX]
"""

from __future__ import annotations

import argparse
import functools
import statistics
from typing import Any, Optional

from common import add_hold_ms, log, p99, private_server, split

#: (label, mirrored checkout); the first is the baseline.
VARIANTS = [
    ("pool.get_connection()", False),
    ("mirrored checkout", True),
]


def _lock_with(mirrored: bool, client: Any, name: str) -> Any:
    """A Lock whose transport takes the mirrored checkout, or not (in a handoff player)."""
    from locks import TTL

    import celery_redislock
    from celery_redislock.transport import _checkout

    _checkout.MIRRORED = mirrored
    return celery_redislock.Lock(client, name, ttl=TTL)


def ratio_line(label: str, mine: list[float], base: list[float]) -> str:
    ratios = [a / b for a, b in zip(mine, base) if b]
    if not ratios:
        return f"| {label} | - | - |"
    return f"| {label} | {statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f}x |"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--handoffs", type=int, default=400, help="measured handoffs per variant")
    parser.add_argument("--batches", type=int, default=10, help="interleaved batches")
    add_hold_ms(parser)
    args = parser.parse_args(argv)
    low, high = args.hold_ms
    if args.batches < 1 or args.handoffs < args.batches or not 1 <= low <= high:
        parser.error("--handoffs at least --batches >= 1, and 1 <= --hold-ms MIN <= MAX")

    # (Imported here: the handoff players are forked and import celery_redislock.)
    import redis
    from locks import Contender, make_client, ms, run_handoffs

    contenders = [
        Contender(label, functools.partial(_lock_with, mirrored)) for label, mirrored in VARIANTS
    ]
    server = private_server()
    n_variants = len(contenders)
    latencies: list[list[float]] = [[] for _ in contenders]
    medians: list[list[float]] = [[] for _ in contenders]
    try:
        client = make_client(server.port)
        log(
            f"redis-server {client.info('server')['redis_version']}; redis-py "
            f"{redis.__version__}; {args.handoffs} handoffs per variant in {args.batches} "
            f"batches, holder releases {low:g}-{high:g} ms after the waiter calls acquire()"
        )
        hold = (low / 1000, high / 1000)
        for b, n in enumerate(split(args.handoffs, args.batches)):
            order = [(b + i) % n_variants for i in range(n_variants)]
            for i in order:
                name = f"bench:transport:{i}:{b}"
                batch = [lat for lat, _, _ in run_handoffs(client, contenders[i], name, n, hold)]
                latencies[i] += batch
                medians[i].append(statistics.median(batch) if batch else 0.0)
            log(f"  batch {b + 1}/{args.batches}")
        client.close()
    finally:
        server.stop()

    print(f"redis-py {redis.__version__}; {args.batches} interleaved batches\n")
    print("| variant | handoffs | handoff median (ms) | handoff p99 (ms) |")
    print("|---|---:|---:|---:|")
    for c, values in zip(contenders, latencies):
        if values:
            print(
                f"| {c.label} | {len(values)} | {ms(statistics.median(values))} | "
                f"{ms(p99(values))} |"
            )
    print()
    print("| handoff median over the other's, per batch | median | range |")
    print("|---|---:|---:|")
    base, mirrored = medians
    print(ratio_line("mirrored checkout / pool.get_connection()", mirrored, base))


if __name__ == "__main__":
    main()
