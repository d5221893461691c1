"""The demo's checks: what each scenario should show, against what Redis recorded.

Pure functions of the measured figures (no Redis, no Celery), so what counts
as a pass is plain to read and to test.  A check prints as one line,
``ok   <name>: <measured>`` or ``FAIL <name>: expected <...>; measured <...>``,
and the demo exits 1 when any check failed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, TextIO


@dataclass(frozen=True)
class Check:
    """One claim of the demo: ``name``, whether it held, and the figures."""

    name: str
    ok: bool
    measured: str
    expected: str

    def line(self) -> str:
        if self.ok:
            return f"ok   {self.name}: {self.measured}"
        return f"FAIL {self.name}: expected {self.expected}; measured {self.measured}"


def report(checks: Sequence[Check], out: TextIO) -> int:
    """Print the summary of ``checks`` (each printed as its scenario ended);
    the exit status: 0 when all held, else 1."""
    failed = [c.name for c in checks if not c.ok]
    if failed:
        print(f"{len(failed)} of {len(checks)} checks FAILED: {', '.join(failed)}", file=out)
        return 1
    print(f"all {len(checks)} checks passed", file=out)
    return 0


# -- measuring, from events in Redis's order ----------------------------------------


def peak_overlap(events: Iterable[dict[str, Any]]) -> int:
    """The most runs between their ``start`` and ``end`` at once (events in order)."""
    running = peak = 0
    for e in events:
        if e["event"] == "start":
            running += 1
            peak = max(peak, running)
        elif e["event"] == "end":
            running -= 1
    return peak


def starts(events: Iterable[dict[str, Any]], field: str = "n") -> list[Any]:
    """``field`` of every ``start``, in the order the runs started."""
    return [e.get(field) for e in events if e["event"] == "start"]


def busiest_second(times: Sequence[float]) -> int:
    """The most of ``times`` (sorted) within any one second, both ends included."""
    return max(
        (sum(1 for t in times[i:] if t <= at + 1.0) for i, at in enumerate(times)), default=0
    )


# -- the checks -------------------------------------------------------------------------


def retry(ran: int, sent: int, peak_same_user: int, retries: int) -> Check:
    return Check(
        "retry",
        ran == sent and peak_same_user == 1,
        f"{ran} of {sent} runs ran; one user's runs overlapped at most {peak_same_user} "
        f"at a time ({retries} contention retries)",
        f"all {sent} to run, one user's runs one at a time",
    )


def skip(ran: int, skipped: int, sent: int) -> Check:
    return Check(
        "skip",
        ran == 1 and skipped == sent - 1,
        f"{ran} of {sent} duplicate runs ran ({skipped} skipped with TaskSkipped)",
        f"1 of {sent} to run and {sent - 1} skipped",
    )


def park(order: Sequence[Any], sent: Sequence[Any], parked: int, peak: int) -> Check:
    return Check(
        "park",
        list(order) == list(sent) and parked == len(sent) - 1 and peak == 1,
        f"{len(order)} runs ran, in the order {list(order)} (sent {list(sent)}); "
        f"{parked} parked, at most {peak} running at once",
        f"every run once, in the order sent, {len(sent) - 1} parked, one at a time",
    )


def semaphore(limit: int, peak: int, ran: int, sent: int) -> Check:
    return Check(
        "semaphore",
        peak <= limit and ran == sent,
        f"{ran} of {sent} runs ran, at most {peak} at once (limit {limit})",
        f"all {sent} to run, never more than {limit} at once",
    )


def fence(
    stale: Optional[int], stale_written: Optional[bool], newer: Optional[int], stored: Optional[str]
) -> Check:
    return Check(
        "fence",
        stale is not None
        and newer is not None
        and stale < newer
        and stale_written is False
        and stored == "200",
        f"the stalled run's write with fence {stale} was "
        f"{'refused' if stale_written is False else 'not refused'}; the store holds "
        f"{stored!r}, written with fence {newer}",
        "the stale write refused and the newer run's '200' stored",
    )


def unique(publishes: int, messages: int, jobs: int, runs: int) -> Check:
    return Check(
        "unique",
        messages == 1 and jobs == 1 and runs == 1,
        f"{publishes} publishes sent {messages} message(s): {jobs} job, {runs} run",
        f"{publishes} publishes to send 1 message and run once",
    )


def rate(ran: int, sent: int, busiest: int, per_second: int, deferred: Sequence[str]) -> Check:
    """``busiest``: the most runs that started within one second; ``deferred``:
    the task ids a ``rate_limited`` signal deferred (each once at most)."""
    once = len(deferred) == len(set(deferred))
    return Check(
        "rate",
        ran == sent and busiest <= per_second + 1 and once,
        f"{ran} of {sent} runs ran, at most {busiest} in any second; {len(deferred)} "
        f"deferred, {'each once' if once else 'some more than once'}",
        f"all {sent} to run, at most {per_second} a second (+1 at the edge), "
        "a deferred run sent once more",
    )


def operating(
    listed: Optional[dict[str, Any]], run: dict[str, Any], old: int, new: int, next_ran: bool
) -> Check:
    """``listed``: the stuck hold as the listing showed it (task, task id, pid);
    ``run``: what the stuck run recorded; ``old``/``new``: its fence and the one
    ``release`` raised it to; ``next_ran``: the next run went ahead."""
    found = listed is not None and (listed["task_id"], listed["pid"]) == (run["id"], run["pid"])
    shown = "nothing"
    if listed is not None:
        shown = f"{listed['task']}[{str(listed['task_id'])[:8]}] pid {listed['pid']}"
    return Check(
        "operating",
        found and old == run.get("fence") and new > old and next_ran,
        f"ls showed the stuck hold ({shown}); release raised its fence {old} -> {new}; "
        f"the next run {'went ahead' if next_ran else 'did not run'}",
        "the stuck run listed with its task and pid, freed with a higher fence, the next run to go",
    )
