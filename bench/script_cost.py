"""Server time of a hand-over: celery_redislock's release script against a bare RPUSH.

A hand-over's latency is the holder's client, the server's work and the
waiter's client.  This script measures the middle part alone, as Redis itself
reports it (SLOWLOG, in microseconds), in the situation ``bench/locks.py``
measures: a waiter blocked in ``acquire()`` and a server that has been idle
for a few milliseconds when the holder releases.  Each round, in rotating
order:

* the release script of a ``Lock`` handing over to a blocked waiter;
* the floor: an ``RPUSH`` that wakes a blocked ``BLPOP``;
* an ``EVALSHA`` of ``return 1`` (what running any script costs).

Prints the median and quartiles of each and the ratio of the medians.  A
benchmark, not a test: it never asserts.

    python bench/script_cost.py [--rounds N] [--idle-ms MS]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any, Callable, Optional

import redis
from common import log, private_server

WAKE = "bench:script-cost:list"


def server_us(client: redis.Redis, command: bytes, match: Optional[bytes] = None) -> int:
    """SLOWLOG's duration of the last ``command`` (whose arguments contain ``match``)."""
    for entry in client.slowlog_get(32):
        words = entry["command"].split()
        if words and words[0].upper() == command and (match is None or match in words):
            return int(entry["duration"])
    raise RuntimeError(f"no {command!r} in SLOWLOG")


def blocked(start: Callable[[], Any], client: redis.Redis) -> threading.Thread:
    """``start`` in a thread, returned once Redis counts it as a blocked client."""
    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while int(client.info("clients")["blocked_clients"]) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the waiter never blocked")
        time.sleep(0.001)
    return thread


def hand_over(client: redis.Redis, waiter: redis.Redis, idle: float, name: str) -> int:
    import celery_redislock
    from celery_redislock.primitives import scripts

    holder = celery_redislock.Lock(client, name, ttl=10, renew=False)
    other = celery_redislock.Lock(waiter, name, ttl=10, renew=False)
    holder.acquire()
    first = holder.fence or 0
    thread = blocked(lambda: other.acquire(timeout=5), client)
    client.slowlog_reset()
    time.sleep(idle)
    holder.release()
    # Read before the waiter's own release, which runs the same script.
    took = server_us(client, b"EVALSHA", scripts.get(holder.kind.scripts.release).sha.encode())
    thread.join()
    if not other.fence or other.fence <= first:
        raise RuntimeError("the waiter was not handed the lock")
    other.release()
    return took


def floor(client: redis.Redis, waiter: redis.Redis, idle: float) -> int:
    thread = blocked(lambda: waiter.blpop([WAKE], timeout=5), client)
    client.slowlog_reset()
    time.sleep(idle)
    client.rpush(WAKE, "token")
    thread.join()
    return server_us(client, b"RPUSH")


def bare_script(client: redis.Redis, idle: float, sha: str) -> int:
    client.slowlog_reset()
    time.sleep(idle)
    client.evalsha(sha, 0)
    return server_us(client, b"EVALSHA", sha.encode())


def quartiles(values: list[int]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):7.1f} | {q[0]:7.1f} | {q[2]:7.1f}"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=200, help="measurements of each")
    parser.add_argument(
        "--idle-ms", type=float, default=10.0, help="idle time before each (default 10)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 4 or args.idle_ms < 0:
        parser.error("--rounds must be at least 4 and --idle-ms not negative")
    server = private_server(["--slowlog-log-slower-than", "0"])
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        waiter = redis.Redis(host="127.0.0.1", port=server.port)
        log(f"redis-server {client.info('server')['redis_version']} on port {server.port}")
        sha = client.script_load("return 1")
        idle = args.idle_ms / 1000
        measures: dict[str, Callable[[], int]] = {
            "release, handing over": lambda: hand_over(client, waiter, idle, "sc"),
            "RPUSH waking a BLPOP": lambda: floor(client, waiter, idle),
            "EVALSHA of return 1": lambda: bare_script(client, idle, sha),
        }
        runs: dict[str, list[int]] = {label: [] for label in measures}
        labels = list(measures)
        for i in range(args.rounds):
            for label in labels[i % 3 :] + labels[: i % 3]:  # rotating order
                runs[label].append(measures[label]())
        base = statistics.median(runs["RPUSH waking a BLPOP"])
        print(
            f"Server time (µs, SLOWLOG), {args.rounds} rounds, "
            f"{args.idle_ms:g} ms idle before each\n"
        )
        print("| command | median | p25 | p75 | median / RPUSH |")
        print("|---|---|---|---|---|")
        for label, values in runs.items():
            print(f"| {label} | {quartiles(values)} | {statistics.median(values) / base:.1f}x |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
