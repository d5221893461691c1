"""The fault campaign across Sentinel failovers, with and without wait_replicas.

Four forked processes loop over two mutexes and one semaphore (limit 2), as
in test_campaign.py, through clients built from the sentinels
(``Sentinel(...).master_for(...)``), while the test fails the master over
twice, without waiting for the replica to catch up first.  Half the
processes connect anew for every section, the others keep their
connections.  A failover leaves the old master taking writes until a
sentinel demotes it (about two seconds here): a process still connected
there is granted names that a process that has just connected to the new
master is granted too, and the old master's grants are thrown away when it
resyncs.

Without ``wait_replicas`` those double grants happen and some go unseen by
both holders: the campaign counts them, and only asserts that fences never
go back.  With ``wait_replicas=1`` a grant the replica did not acknowledge is
undone, so the checker must find nothing: no undetected overlap, no moment
over the semaphore's limit, no fence going back.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults.history import check, load
from tests.faults.workload import PROCESSES, loop
from tests.helpers import fork_context, report, running
from tests.sentinel import LocalSentinel, sentinel_client

pytestmark = [pytest.mark.fault, pytest.mark.slow]

RUN = 9.0  # seconds each process works for
FAILOVERS = 2


def work(topology: LocalSentinel, out: Path, seed: int, until: float, replicas: int) -> None:
    sentinel, client = sentinel_client(topology)
    options: dict[str, Any] = (
        {"wait_replicas": replicas, "wait_timeout_ms": 200} if replicas else {}
    )
    if seed % 2:
        # Half the processes connect anew for every section: during a
        # failover they reach the new master while the others, connected
        # before it, still write to the old one.
        options["fresh"] = lambda: sentinel_client(topology, sentinel)[1]
    loop(client, out, seed, until, **options)


@pytest.mark.parametrize("replicas", [0, 1], ids=["without", "with wait_replicas=1"])
def test_failovers_double_grants_only_without_wait_replicas(
    tmp_path: Path, topology: LocalSentinel, replicas: int
) -> None:
    until = time.monotonic() + RUN
    ctx = fork_context()
    files = [tmp_path / f"history-{i}.jsonl" for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=work, args=(topology, files[i], i, until, replicas))
        for i in range(PROCESSES)
    ]
    failovers = []
    with running(procs):
        time.sleep(1.0)
        for _ in range(FAILOVERS):
            failovers.append(topology.failover(in_sync=False))
            time.sleep(1.0)
        for p in procs:
            p.join(RUN + 15)
            assert p.exitcode == 0
    sections = load(files)
    verdict = check(sections)
    report(
        "fault campaign, sentinel failovers",
        wait_replicas=replicas,
        failovers=len(failovers),
        split_brain_s=sum(f.split_brain for f in failovers),
        **verdict.figures(),
    )
    assert verdict.sections > 30, verdict.summary()
    assert not verdict.fences_back, verdict.fences_back[:3]
    if replicas:
        assert verdict.ok, (verdict.summary(), verdict.undetected_overlaps[:3])
