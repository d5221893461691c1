"""A fault campaign: processes take locks and a semaphore while faults hit them.

Four forked processes loop for a few seconds over two mutexes and one
semaphore (limit 2) on a private redis-server, reached through a loopback
TCP proxy, recording every critical section as it ends
(tests/faults/history.py): two with the sync primitives, two with the
asyncio ones, on the same names.  Meanwhile the test pauses processes with
SIGSTOP for longer than the lease, SIGKILLs one while it may hold a lease
(and starts another in its place), stalls every connection past the lease,
resets every connection, and once SIGKILLs the server and starts it again:
without persistence (every key gone) or with AOF (``appendfsync always``).
Then the checker judges the histories: no undetected overlap of mutex
holders, never more semaphore holders than the limit, fences rising per
name, every overlap detected.  (Failovers: tests/faults/test_failover.py.)
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from tests.faults.history import Section, check, load
from tests.faults.workload import PROCESSES, TTL, async_loop, loop
from tests.helpers import TcpProxy, fork_context, forking, report, running
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.fault, pytest.mark.slow]

RUN = 10.0  # seconds each process works for


def work(port: int, out: Path, seed: int, until: float) -> None:
    """A process of the campaign: odd seeds use the asyncio primitives."""
    options: dict[str, Any] = {"port": port, "socket_connect_timeout": 0.5, "socket_timeout": 1.0}
    if seed % 2:
        asyncio.run(async_loop(redis.asyncio.Redis(**options), out, seed, until))
    else:
        loop(redis.Redis(**options), out, seed, until)


@pytest.mark.parametrize("persistence", ["none", "aof"])
def test_no_undetected_double_grant_under_pauses_stalls_resets_and_a_restart(
    tmp_path: Path, persistence: str
) -> None:
    aof = ["--appendonly", "yes", "--appendfsync", "always"] if persistence == "aof" else []
    server = RedisServer(extra=aof).start()
    port = server.port
    proxy = TcpProxy("127.0.0.1", port)  # the workers reach Redis through it
    until = time.monotonic() + RUN
    ctx = fork_context()
    files = [tmp_path / f"history-{i}.jsonl" for i in range(PROCESSES)]  # (odd i: asyncio)
    procs = [
        ctx.Process(target=work, args=(proxy.port, files[i], i, until)) for i in range(PROCESSES)
    ]
    killed: list[Any] = []
    began: list[tuple[float, str]] = []  # (when, which fault)
    faults: dict[str, int] = {"pauses": 0, "kills": 0, "stalls": 0, "resets": 0, "restarts": 0}
    rng = random.Random(7)
    try:
        with running(procs):
            time.sleep(1.0)
            # Each at least once, then at random.
            planned = ["pause", "kill", "stall", "reset"]
            while time.monotonic() < until - 1.5:
                fault = planned.pop(0) if planned else rng.choice(("pause", "stall", "reset"))
                began.append((time.monotonic(), fault))
                if fault == "kill":
                    # A holder dies (its lease must free itself); another takes its place.
                    victim = rng.choice([p for p in procs if p.is_alive()])
                    victim.kill()
                    victim.join(5)
                    files.append(tmp_path / f"history-{len(files)}.jsonl")
                    spare = ctx.Process(
                        target=work, args=(proxy.port, files[-1], len(files) - 1, until)
                    )
                    with forking():
                        spare.start()
                    procs.append(spare)
                    killed.append(victim)
                    faults["kills"] += 1
                elif fault == "pause":
                    victim = rng.choice(procs)
                    os.kill(victim.pid, signal.SIGSTOP)  # a GC pause, a frozen VM
                    time.sleep(rng.uniform(TTL * 1.5, TTL * 2.5))
                    os.kill(victim.pid, signal.SIGCONT)
                    faults["pauses"] += 1
                elif fault == "stall":
                    proxy.stall()  # every connection at once, past the lease
                    time.sleep(rng.uniform(TTL * 1.2, TTL * 2.0))
                    proxy.resume()
                    faults["stalls"] += 1
                else:
                    proxy.reset()
                    faults["resets"] += 1
                if not faults["restarts"] and time.monotonic() > until - RUN / 2:
                    # SIGKILL, then start again on the same port and directory:
                    # with AOF every acknowledged write is back; without, every
                    # key (leases, queues, fences) is gone.
                    began.append((time.monotonic(), "restart"))
                    server.restart()
                    faults["restarts"] += 1
                time.sleep(rng.uniform(0.2, 0.5))
            for p in procs:
                p.join(RUN + 15)
                assert p in killed or p.exitcode == 0
    finally:
        proxy.close()
        server.stop()
    sections = load(files)
    verdict = check(sections)
    by_asyncio = len(load(f for i, f in enumerate(files) if i % 2))
    report(
        f"fault campaign, persistence={persistence}",
        **faults,
        **verdict.figures(),
        asyncio_sections=by_asyncio,
    )
    for fault, totals in sorted(verdict.by_fault(began).items()):
        report(f"  after a {fault}", **totals)
    assert verdict.sections > 50, verdict.summary()
    assert by_asyncio > 10 and verdict.sections - by_asyncio > 10, by_asyncio
    assert faults["restarts"] == 1 and sum(faults.values()) >= 6
    assert faults["pauses"] and faults["kills"] and faults["stalls"] and faults["resets"]
    assert verdict.ok, (verdict.summary(), verdict.undetected_overlaps[:3], verdict.fences_back[:3])


def test_the_checker_finds_what_it_must() -> None:
    """The checker itself: an undetected overlap, an over-limit moment and a
    fence that went back are each reported; a detected overlap is not."""
    a = Section("m", 1, 10, 0.0, 1.0, "released", 1, 0.0)
    b = Section("m", 1, 11, 0.5, 1.5, "released", 2, 0.5)
    c = Section("m", 1, 12, 0.6, 0.7, "lost", 3, 0.6)
    d = Section("m", 1, 9, 2.0, 2.1, "released", 4, 2.0)
    verdict = check([a, b, c, d])
    assert (a, b) in verdict.undetected_overlaps
    assert verdict.detected_overlaps == 2  # (a, c) and (b, c)
    assert (a, d) in verdict.fences_back
    # Each finding goes to the last fault that began before it.
    totals = verdict.by_fault([(0.4, "pause"), (0.55, "stall"), (1.9, "reset")])
    assert totals["pause"]["undetected_overlaps"] == 1  # (a, b), from 0.5
    assert totals["stall"]["detected_overlaps"] == 2  # from 0.6
    assert totals["reset"]["fences_back"] == 3  # d (after a, b and c), granted at 2.0
    sems = [Section("s", 2, i, i * 0.01, 1.0, "released", i, i * 0.01) for i in range(3)]
    assert check(sems).over_limit
    assert check([a, c]).ok
