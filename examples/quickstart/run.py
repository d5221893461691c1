"""Run the quickstart: a worker, duplicate jobs, and what the locks did with them.

    python examples/quickstart/run.py              # private redis-server on a free port
    REDIS_URL=redis://127.0.0.1:6379 python examples/quickstart/run.py

Starts ``celery -A tasks worker -P prefork -c 4`` as a subprocess, submits
duplicates of each task in tasks.py, prints what ran, what was skipped (and
which run held the lock), what was retried, which write the fencing token
refused and which publishes of a unique job sent nothing, then stops
everything it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class EmbeddedRedis:
    """A throwaway redis-server on a free loopback port, nothing written to disk."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            sys.exit(
                "redis-server is not installed (apt-get install redis-server), or set REDIS_URL"
            )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="quickstart-redis-")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    sys.exit(f"redis-server did not start on port {self.port}")
                time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class Worker:
    """``celery -A tasks worker -P prefork -c 4`` in its own process group."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile(prefix="quickstart-worker-")  # noqa: SIM115 - see stop()
        path = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "prefork", "-c", "4",
             "-l", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=HERE, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, app: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if app.control.ping(timeout=0.5):
                return
        self.log.seek(0)
        sys.exit("the worker did not start:\n" + self.log.read().decode(errors="replace"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # pool children, if any are left
        self.proc.wait(5)
        self.log.close()


# -- printing ----------------------------------------------------------------------


def short(task_id: Any) -> str:
    return str(task_id)[:8] if task_id else "?"


def events(client: Any) -> list[dict[str, Any]]:
    return [json.loads(e) for e in client.lrange("quickstart:events", 0, -1)]


def call(e: dict[str, Any]) -> str:
    return f"{e['task']}({', '.join(repr(a) for a in e['args'])})"


def report(client: Any, t0: float, ids: dict[str, str]) -> None:
    """Print the runs and contentions recorded for the task ids in ``ids`` (id -> call)."""
    seen = [e for e in events(client) if e.get("id") in ids]
    retries = Counter(e["id"] for e in seen if e["event"] == "contended" and e["policy"] == "retry")
    for e in seen:
        at = f"{e['at'] - t0:5.2f}s"
        who = f"{ids[e['id']]:<24} [{short(e['id'])}]"
        if e["event"] == "start":
            fence = f" with fence {e['fence']}" if e.get("fence") else ""
            print(f"  {at}  ran      {who}{fence}")
        elif e["event"] == "end" and e.get("outcome"):
            print(f"  {at}  wrote    {who} -> {e['outcome']}")
        elif e["event"] == "contended":
            print(f"  {at}  {e['policy']:<8} {who}: lock held by [{short(e['holder'])}]")
    for task_id, n in retries.items():
        print(f"  {ids[task_id]} [{short(task_id)}] was retried {n} time(s) before it ran")


# -- the demo ------------------------------------------------------------------------


def demo(tasks: Any, client: Any) -> None:
    from celery_redislock import TaskSkipped

    t0 = time.time()
    print('\n1) sync_user: lock_key=["user_id"], on_contention="retry"')
    print("   3 x sync_user(42) and 1 x sync_user(7), submitted at once")
    calls = [42, 42, 42, 7]
    results = [tasks.sync_user.delay(u) for u in calls]
    for res in results:
        res.get(timeout=30)
    report(client, t0, {res.id: f"sync_user({u})" for res, u in zip(results, calls)})
    print("   every sync ran; the three for user 42 one after another, user 7 alongside")

    t0 = time.time()
    print('\n2) rebuild_report: one lock for the task, on_contention="skip"')
    print("   3 x rebuild_report(), submitted at once")
    results = [tasks.rebuild_report.delay() for _ in range(3)]
    for res in results:
        value = res.get(timeout=30, propagate=False)
        if isinstance(value, TaskSkipped):
            print(f"  skipped  rebuild_report() [{short(res.id)}]: held by [{short(value.holder)}]")
        else:
            print(f"  ran      rebuild_report() [{short(res.id)}] -> {value!r}")

    t0 = time.time()
    print('\n3) set_balance: lock_key=["account"], lock_ttl=1, fenced writes')
    print("   A takes the lock, then its process stalls (SIGSTOP) past the 1 s lease;")
    print('   B waits (on_contention="wait"), gets the lock when A\'s lease runs out, writes;')
    print("   then A wakes up and tries to write with its old fence")
    a = tasks.set_balance.delay("acct-1", 100, stall=True)
    pid = None
    deadline = time.monotonic() + 20
    while pid is None and time.monotonic() < deadline:
        pid = client.get("quickstart:stalled")
        time.sleep(0.05)
    if pid is None:
        sys.exit("task A never started")
    try:
        b = tasks.set_balance.delay("acct-1", 200)
        print(f"  B -> {b.get(timeout=30)}")
    finally:
        os.kill(int(pid), signal.SIGCONT)  # wake A whatever happened
    print(f"  A -> {a.get(timeout=30)}")
    report(client, t0, {a.id: "set_balance('acct-1', 100)", b.id: "set_balance('acct-1', 200)"})
    store = tasks.FencedStore(client)
    print(f"  the store holds balance {store.read('balance:acct-1')}: B's write, A's was refused")
    for e in events(client):
        if e["event"] == "lock lost":
            print(f"  A's worker also reported lock_lost: {e['reason']}")

    t0 = time.time()
    print('\n4) refresh_feed: lock_key=["feed"], unique="until_finished"')
    print('   5 x refresh_feed("news") at once, then once more after it has run')
    results = [tasks.refresh_feed.delay("news") for _ in range(5)]
    ids = {res.id for res in results}
    print(f"  5 publishes, {len(ids)} job: every caller got [{short(results[0].id)}]")
    print(f"  -> {results[0].get(timeout=30)}")
    again = tasks.refresh_feed.delay("news")
    print(f"  published again once it had run: a new job [{short(again.id)}] -> "
          f"{again.get(timeout=30)}")  # fmt: skip
    ran = [e for e in events(client) if e["event"] == "start" and e["task"] == "refresh_feed"]
    print(f"  refresh_feed ran {len(ran)} times for 6 publishes")

    print("\n5) operating: see who holds a lock, and free a stuck one")
    print("   rebuild_report(seconds=8) runs; `celery redislock ls` names its holder,")
    print("   `celery redislock release` frees it with a raised fence, another run goes ahead")
    stuck = tasks.rebuild_report.delay(seconds=8)
    started = time.monotonic()
    while not any(e["event"] == "start" and e["id"] == stuck.id for e in events(client)):
        if time.monotonic() - started > 20:
            sys.exit("rebuild_report never started")
        time.sleep(0.05)
    print(indent(redislock("ls", "--kind", "lock")))
    print(indent(redislock("release", tasks.rebuild_report.name, "--yes")))
    after = tasks.rebuild_report.delay(seconds=0.1)
    print(f"  a new rebuild_report [{short(after.id)}] -> {after.get(timeout=30)!r}")
    stuck.get(timeout=30)
    for e in events(client):
        if e["event"] == "lock lost" and "rebuild_report" in e["key"]:
            print(f"  the freed run's worker reported lock_lost: {e['reason']}")


def redislock(*args: str) -> str:
    """Output of ``celery -A tasks redislock ARGS`` (the library's command)."""
    command = [sys.executable, "-m", "celery", "-A", "tasks", "redislock", *args]
    done = subprocess.run(command, cwd=HERE, capture_output=True, text=True, timeout=60)
    if done.returncode:
        sys.exit(f"{' '.join(command[2:])} failed:\n{done.stdout}{done.stderr}")
    return f"$ celery -A tasks redislock {' '.join(args)}\n{done.stdout.rstrip()}"


def indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--embedded",
        action="store_true",
        default=None,
        help="start a private redis-server (the default when REDIS_URL is not set)",
    )
    args = parser.parse_args()
    embedded = args.embedded if args.embedded is not None else not os.environ.get("REDIS_URL")

    server = EmbeddedRedis() if embedded else None
    if server is not None:
        os.environ["REDIS_URL"] = server.url
    sys.path.insert(0, str(HERE))
    worker = None
    try:
        import tasks  # reads REDIS_URL through celeryconfig

        client = tasks.r()
        for key in client.scan_iter("quickstart:*"):  # only this demo's own keys
            client.delete(key)
        where = "a private redis-server" if server else "REDIS_URL"
        print(f"Redis: {os.environ['REDIS_URL']} ({where})")
        worker = Worker()
        worker.wait_ready(tasks.app)
        print(f"worker: celery -A tasks worker -P prefork -c 4 (pid {worker.proc.pid})")
        demo(tasks, client)
    finally:
        if worker is not None:
            worker.stop()
        if server is not None:
            server.stop()
    print("\nstopped the worker" + (" and redis-server" if server else ""))


if __name__ == "__main__":
    main()
