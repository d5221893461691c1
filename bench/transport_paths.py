"""The transport's hand-written steps against redis-py's public path, on a hand-over.

The transport may take a connection from a plain pool in its own steps
(``_checkout.MIRRORED``) instead of ``pool.get_connection()``, and pack a
script call itself (``_encode.HAND_PACKED``) instead of through the
connection's ``pack_command``.  Each is switchable in the process; this runs
``bench/locks.py``'s hand-over measurement (two processes playing ping-pong
with one Lock; latency is the waiter's acquire-return time minus the holder's
release-call time) with every combination of the two, in interleaved batches
(the variants in rotating order, then again) on one private redis-server, and
prints each variant's median over the public path's, batch by batch (the
median of those ratios, and their range).  A step earns its place at a ratio
of 0.90x or less.  A benchmark, not a test: it never asserts.

    python bench/transport_paths.py [--handoffs N] [--batches N] [--hold-ms MIN MAX]
"""

from __future__ import annotations

import argparse
import functools
import statistics
from typing import Any, Optional

from common import add_hold_ms, log, p99, private_server, split

#: (label, mirrored checkout, hand-packed); the first is the baseline.
VARIANTS = [
    ("redis-py's path (get_connection, pack_command)", False, False),
    ("mirrored checkout", True, False),
    ("hand-packed calls", False, True),
    ("both steps", True, True),
]


def _lock_with(mirrored: bool, hand_packed: bool, client: Any, name: str) -> Any:
    """A Lock whose transport takes (or skips) the steps (in a handoff player)."""
    from locks import TTL

    import celery_redislock
    from celery_redislock.transport import _checkout, _encode

    _checkout.MIRRORED = mirrored
    _encode.HAND_PACKED = hand_packed
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
        Contender(label, functools.partial(_lock_with, mirrored, packed))
        for label, mirrored, packed in VARIANTS
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
    base, mirrored, packed, both = medians
    print(ratio_line("mirrored checkout / redis-py's path", mirrored, base))
    print(ratio_line("hand-packed calls / redis-py's path", packed, base))
    print(ratio_line("both steps / redis-py's path", both, base))
    print(ratio_line("both steps / hand-packed only (the checkout's share)", both, packed))
    print(ratio_line("both steps / mirrored only (the packing's share)", both, mirrored))


if __name__ == "__main__":
    main()
