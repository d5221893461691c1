"""``python -m celery_redislock.demo``: the library on a real worker, checked.

    python -m celery_redislock.demo                  # a private redis-server
    REDIS_URL=redis://127.0.0.1:6379/0 python -m celery_redislock.demo

Uses ``REDIS_URL`` (its db and the next two) or starts a private redis-server,
starts ``celery worker -P prefork -c 4`` on the demo's tasks, runs a scenario
per policy and feature, prints each check with what it measured, stops what it
started, and exits 1 when a check failed (2 when the demo could not run).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Iterator

from .config import KEY_PREFIX, URL_ENV

INSTALL = "pip install 'celery-redislock[demo]'"


def transport_missing() -> str | None:
    """Why kombu's Redis transport cannot load (its extra deps), or None."""
    try:
        import kombu.transport.redis  # noqa: F401
    except ImportError as exc:
        return f"kombu's Redis transport cannot be imported ({exc}): {INSTALL}"
    return None


@contextlib.contextmanager
def redis_url() -> Iterator[tuple[str, str]]:
    """``REDIS_URL`` when set, else a private server's URL; with where it came from."""
    if os.environ.get(URL_ENV):
        yield os.environ[URL_ENV], URL_ENV
        return
    # PATH's redis-server, else the demo extra's; RedisServerNotFound says what to install.
    from celery_redislock.testing.server import redis_server as private_redis

    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(private_redis())
        except OSError as exc:
            raise RuntimeError(f"cannot start redis-server: {exc}") from exc
        os.environ[URL_ENV] = url  # the worker and the demo app read it
        yield url, "a private redis-server"


def run() -> int:
    """Start the worker, run every scenario, print its check; the exit status."""
    import redis

    from . import checks, config, records, scenarios, tasks
    from .processes import Worker

    r = records.client()
    try:
        r.ping()
    except redis.RedisError as exc:
        raise RuntimeError(f"cannot reach Redis at {config.lock_url()}: {exc}") from exc
    records.clear(r, KEY_PREFIX)
    worker = Worker()
    try:
        worker.wait_ready(tasks.app)
        print(f"worker: celery -A {tasks.__name__} worker -P prefork -c 4 (pid {worker.proc.pid})")
        results = []
        for scenario in scenarios.ALL:
            if worker.proc.poll() is not None:
                raise RuntimeError("the worker exited:\n" + worker.output())
            try:
                results.append(scenario(r))
            except Exception as exc:  # a FAIL line of its own, and on to the next
                what = f"{type(exc).__name__}: {exc}"
                results.append(checks.Check(scenario.__name__, False, what, "it to finish"))
            print(results[-1].line())
    finally:
        worker.stop()
        # Results unsubscribe as they are collected: let them do it while Redis
        # is up (Celery before 5.5 reconnects, and fails loudly, once it is gone).
        gc.collect()
    print()
    return checks.report(results, sys.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m celery_redislock.demo", description=(__doc__ or "").split("\n", 1)[0]
    )
    parser.parse_args()
    missing = transport_missing()
    if missing:
        print(f"demo: {missing}", file=sys.stderr)
        sys.exit(2)
    try:
        with redis_url() as (url, where):
            print(f"Redis: {url} ({where}): broker on its db, results and locks on the next two")
            status = run()
    except RuntimeError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        status = 2
    sys.exit(status)


if __name__ == "__main__":
    main()
