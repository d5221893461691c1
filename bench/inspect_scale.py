"""Listing at scale: ``Inspector.entries()`` on a server full of other keys.

Starts one private redis-server on a free loopback port, fills it with
1,000,000 unrelated keys (``DEBUG POPULATE``) and 10,000 names of ours
(7,000 held locks, 2,000 semaphores with two permits held, 1,000 unique keys
with a waiting job), then times, in alternated batches:

* ``Inspector.entries()``: SCAN with a MATCH on the prefix, then the
  pipelined reads of every name (what ``celery redislock ls`` does);
* the baseline: the same SCAN alone, keys only (``redis-cli --scan
  --pattern``), the least any listing that never uses KEYS can cost;
* for scale, ``KEYS prefix:*`` (what a listing that blocks the server costs
  it; run once per batch).

Prints each time's median and the ratio of the listing to the SCAN alone,
and the round trips of one listing.

    python bench/inspect_scale.py [--unrelated N] [--ours N] [--batches N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from bench.common import log, private_server

from celery_redislock import Lock, Semaphore
from celery_redislock.inspect import Inspector
from celery_redislock.ops import reading
from celery_redislock.primitives import keys, unique

PREFIX = "redislock"


def fill(client: redis.Redis, unrelated: int, ours: int) -> None:
    client.execute_command("DEBUG", "POPULATE", unrelated, "other")
    locks, sems = ours * 7 // 10, ours * 2 // 10
    uniques = ours - locks - sems
    pipe = client.pipeline(transaction=False)
    for i in range(locks):
        k = keys.lock_keys(PREFIX, f"job:{i}")
        token = f"task-{i}|celery@web-1|{1000 + i % 50}|proj.sync|abcdef{i:x}"
        pipe.set(k.lock, token, px=3_600_000)
        pipe.set(k.fence, 1_700_000_000_000_000 + i, px=3_600_000)
        if len(pipe) >= 2000:
            pipe.execute()
    pipe.execute()
    for i in range(sems):
        s = Semaphore(client, f"api:{i}", 3, ttl=3600, renew=False)
        s.acquire(blocking=False)
        Semaphore(client, f"api:{i}", 3, ttl=3600, renew=False).acquire(blocking=False)
    for i in range(uniques):
        unique.publish(client, keys.unique_key(PREFIX, f"u:{i}"), f"job-{i}", "f", 3_600_000)
    assert Lock  # (the primitives' module is what a listing reads)


def scan_only(client: redis.Redis) -> int:
    return sum(1 for _ in client.scan_iter(match=f"{PREFIX}:{{*}}:*", count=reading.SCAN_COUNT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--unrelated", type=int, default=1_000_000)
    parser.add_argument("--ours", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    server = private_server(["--enable-debug-command", "local"])
    try:
        client = redis.Redis.from_url(server.url)
        started = time.monotonic()
        fill(client, args.unrelated, args.ours)
        log(f"filled: {client.dbsize():,} keys in {time.monotonic() - started:.1f} s")
        inspector = Inspector(client, PREFIX)
        listed = inspector.entries()
        log(f"names listed: {len(listed):,} ({scan_only(client):,} keys of ours)")
        ours, scans, keys_all = [], [], []
        for _ in range(args.batches):
            t = time.perf_counter()
            n = len(inspector.entries())
            ours.append(time.perf_counter() - t)
            assert n == len(listed)
            t = time.perf_counter()
            scan_only(client)
            scans.append(time.perf_counter() - t)
            t = time.perf_counter()
            client.keys(f"{PREFIX}:*")
            keys_all.append(time.perf_counter() - t)
        ratios = [a / b for a, b in zip(ours, scans)]
        print(f"server: {args.unrelated:,} unrelated keys, {args.ours:,} names of ours")
        print(
            f"Inspector.entries(): median {statistics.median(ours):.2f} s "
            f"(min {min(ours):.2f}, max {max(ours):.2f})"
        )
        print(f"SCAN alone:          median {statistics.median(scans):.2f} s")
        print(f"KEYS (blocks the server meanwhile): median {statistics.median(keys_all):.2f} s")
        print(
            f"listing / SCAN alone: median {statistics.median(ratios):.2f}x "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}x)"
        )
        calls = []
        original = client.connection_pool.get_connection

        def counting(*a: object, **kw: object) -> object:
            conn = original(*a, **kw)
            send = conn.send_packed_command
            if not getattr(send, "counted", False):

                def counted(command: object, check_health: bool = True) -> None:
                    calls.append(1)
                    send(command, check_health)

                counted.counted = True  # type: ignore[attr-defined]
                conn.send_packed_command = counted  # type: ignore[method-assign]
            return conn

        client.connection_pool.get_connection = counting  # type: ignore[method-assign]
        inspector.entries()
        print(
            f"round trips of one listing: {len(calls)} (SCAN calls plus one pipeline per 500 names)"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
