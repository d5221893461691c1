"""Small helpers shared by the benchmark scripts in bench/."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "add_hold_ms",
    "command_name",
    "log",
    "p99",
    "private_server",
    "split",
    "tasks_and_rounds",
    "time_cycles",
]

now = time.monotonic  # CLOCK_MONOTONIC: one clock for every process

#: The checkout the benchmarks run from (tests/ holds the throwaway server).
ROOT = Path(__file__).resolve().parent.parent


def private_server(extra: Optional[list[str]] = None) -> Any:
    """A started throwaway redis-server on a free loopback port
    (:class:`celery_redislock.testing.RedisServer`, with more options ``extra``)."""
    from celery_redislock.testing import RedisServer

    return RedisServer(extra=extra).start()


def command_name(packed: Any) -> str:
    """``EVALSHA`` from ``*6\\r\\n$7\\r\\nEVALSHA\\r\\n...`` (the first command of a write)."""
    head = packed if isinstance(packed, (bytes, str)) else packed[0]
    if isinstance(head, str):
        head = head.encode()
    parts = bytes(head).split(b"\r\n", 3)
    return parts[2].decode().upper() if len(parts) > 2 else "?"


def time_cycles(primitive: Any, cycles: int) -> list[float]:
    """Wall time of each of ``cycles`` uncontended acquire + release pairs."""
    times = []
    for _ in range(cycles):
        t0 = now()
        primitive.acquire()
        primitive.release()
        times.append(now() - t0)
    return times


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile (with fewer than 100 samples: the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals (start, end) that were open at one moment."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def split(total: int, parts: int) -> list[int]:
    """``total`` spread over ``parts`` batches as evenly as possible."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_hold_ms(parser: argparse.ArgumentParser) -> None:
    """``--hold-ms MIN MAX``: how long a handoff's holder holds (default 5-30 ms)."""
    parser.add_argument(
        "--hold-ms",
        type=float,
        nargs=2,
        default=[5.0, 30.0],
        metavar=("MIN", "MAX"),
        help="the holder releases a uniform random MIN-MAX ms after the waiter "
        "calls acquire() (default: 5 30)",
    )


def tasks_and_rounds(
    doc: str, argv: Any, tasks: int, tasks_help: str, rounds_help: str
) -> argparse.Namespace:
    """Parse ``--tasks`` and ``--rounds`` (both positive; 7 rounds by default)."""
    parser = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=tasks, help=tasks_help)
    parser.add_argument("--rounds", type=int, default=7, help=rounds_help)
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.rounds < 1:
        parser.error("--tasks and --rounds must be positive")
    return args
