"""Memory benchmark: what distinct lock names leave in Redis once released.

Starts one private redis-server on a free loopback port.  For each contender,
on an empty database: take and release a lock on ``--names`` distinct names
(one per user, say), then read ``DBSIZE`` and ``INFO memory``'s
``used_memory`` (minus what the empty database used).  celery_redislock keeps
one key per name (its fence floor) for ``fence_retention`` seconds after the
last release; the run waits that long and reads both again.  The peers delete
their key on release and keep no fence.  A benchmark, not a test: it never
asserts.

    python bench/memory.py [--names N] [--retention S]
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import redis
from common import private_server

from celery_redislock import Lock


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def fill(r: redis.Redis, names: int, make: Callable[[str], Any]) -> None:
    for i in range(names):
        lock = make(f"user-{i}")
        lock.acquire()
        lock.release()


def contenders(r: redis.Redis, retention: float) -> dict[str, Callable[[str], Any]]:
    options: dict[str, Any] = {"ttl": min(30.0, retention), "renew": False}
    try:  # (an older celery_redislock, without fence_retention, as the "before" run)
        Lock(r, "probe", fence_retention=retention, **options)
        options["fence_retention"] = retention
    except TypeError:
        pass
    found: dict[str, Callable[[str], Any]] = {
        "celery_redislock": lambda name: Lock(r, name, **options),
        "redis-py Lock": lambda name: r.lock(name, timeout=30),
    }
    try:
        import redis_lock

        found["python-redis-lock"] = lambda name: redis_lock.Lock(r, name, expire=30)
    except ImportError:
        pass
    try:
        from pottery import Redlock

        found["pottery Redlock"] = lambda name: Redlock(key=name, masters={r}, auto_release_time=30)
    except ImportError:
        pass
    return found


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--names", type=int, default=100_000)
    parser.add_argument("--retention", type=float, default=60.0, help="fence_retention, s")
    parser.add_argument("--only", default=None, help="run only this contender")
    args = parser.parse_args(argv)
    server = private_server()
    r = redis.Redis(port=server.port)
    rows = []
    try:
        for label, make in contenders(r, args.retention).items():
            if args.only and label != args.only:
                continue
            r.flushall()
            r.memory_purge()
            base = used(r)
            t0 = time.monotonic()
            fill(r, args.names, make)
            elapsed = time.monotonic() - t0
            keys, grown = r.dbsize(), used(r) - base
            later = ""
            if label == "celery_redislock":
                # Redis drops expired keys in the background, a sample at a time.
                deadline = time.monotonic() + args.retention + 30.0
                while r.dbsize() and time.monotonic() < deadline:
                    time.sleep(0.5)
                later = f"{r.dbsize()} keys, {max(0, used(r) - base) / 2**20:.1f} MiB"
            rows.append((label, keys, grown, elapsed, later))
    finally:
        r.close()
        server.kill()
    print(f"{args.names} distinct names, each locked and released once")
    print()
    print(
        "| contender | keys left | used_memory growth | bytes per name | "
        f"after the {args.retention:g} s retention | fill time |"
    )
    print("|---|---:|---:|---:|---|---:|")
    for label, keys, grown, elapsed, later in rows:
        print(
            f"| {label} | {keys} | {grown / 2**20:.1f} MiB | {grown / args.names:.0f} | "
            f"{later or 'n/a'} | {elapsed:.1f} s |"
        )


if __name__ == "__main__":
    main()
