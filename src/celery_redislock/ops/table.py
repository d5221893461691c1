"""What ``celery redislock`` prints for people: safe cells, short durations, aligned tables.

Names, task names, hostnames and tokens are user data read from Redis: a
cell that is not plainly printable is shown as its ``repr`` (quoted, its
control characters escaped), so a lock name cannot move the terminal's
cursor, clear the screen or forge a line of the table.  Shared by the
one-shot commands (:mod:`.cli`) and the live view (:mod:`.top`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from .entries import Entry, Holder, Kind, ParkedRun, UniqueJobs, Waiter

__all__ = [
    "COLUMNS",
    "PARKED_COLUMNS",
    "WAITER_COLUMNS",
    "duration",
    "entry_rows",
    "holder_label",
    "parked_rows",
    "render",
    "safe",
    "show_lines",
    "waiter_rows",
    "width",
]

#: The columns of ``ls`` and ``top``: one row per hold (a unique key's job counts as one).
COLUMNS = (
    "KIND",
    "NAME",
    "MODE",
    "HOLDER",
    "HOST",
    "PID",
    "FENCE",
    "TTL",
    "HELD",
    "WAITERS",
    "PARKED",
)
PARKED_COLUMNS = ("ID", "KIND", "NAME", "TASK", "POSITION", "WAITED")
WAITER_COLUMNS = ("WAITER", "MODE", "WAITED")
#: Columns aligned right (numbers and durations).
NUMERIC = frozenset(
    {"NAMES", "PID", "FENCE", "TTL", "HELD", "WAITERS", "PARKED", "POSITION", "WAITED"}
)
_NONE = "-"


def safe(value: Any) -> str:
    """``value`` as text fit for a terminal: as it is when every character is
    printable, else its ``repr`` (quoted, with ``\\x1b``, ``\\n``... escaped)."""
    if value is None:
        return _NONE
    s = str(value)
    return s if s.isprintable() else repr(s)


def width(s: str) -> int:
    """Columns ``s`` takes on a terminal (wide East Asian characters take two)."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in s
    )


def duration(ms: Optional[int]) -> str:
    """A short duration: ``850ms``, ``4.8s``, ``48s``, ``2m05s``, ``1h02m``, ``3d04h``."""
    if ms is None:
        return _NONE
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    s = ms // 1000
    if s < 10:
        return f"{ms / 1000:.1f}s"
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _count(n: Optional[int]) -> str:
    return _NONE if n is None else str(n)


def task_label(task_name: Optional[str], task_id: Optional[str]) -> str:
    """``task.name[task-id]``, the way Celery's logs name a run."""
    return f"{safe(task_name) if task_name else '?'}[{safe(task_id)}]"


def holder_label(h: Holder) -> str:
    """A task run as ``task.name[task-id]``; any other holder by its token."""
    return task_label(h.task_name, h.task_id) if h.task_id else safe(h.token)


def host_label(h: Holder) -> str:
    """The worker's node name; ``(in flight)`` for a hold granted to a parked
    run on its way to a worker (it runs nowhere yet)."""
    if h.hostname:
        return safe(h.hostname)
    return "(in flight)" if h.parked else _NONE


def entry_rows(entry: Entry) -> list[tuple[str, ...]]:
    """The rows of one entry, in :data:`COLUMNS` order: one per holder (per job
    of a unique key), or one row of dashes when nothing holds it."""
    kind, name = entry.kind.value, safe(entry.name)
    waiters, parked = str(entry.waiters), str(entry.parked)
    if entry.kind is Kind.UNIQUE:
        u = entry.unique
        jobs = []
        if u is not None:
            jobs = [
                (mode, job, ttl)
                for mode, job, ttl in (
                    ("waiting", u.waiting, u.waiting_ttl_ms),
                    ("running", u.running, u.running_ttl_ms),
                    ("throttle", u.throttled_by, u.throttle_ttl_ms),
                )
                if job
            ]
        if not jobs:
            return [(kind, name, _NONE, _NONE, _NONE, _NONE, _NONE, _NONE, _NONE, "0", "0")]
        return [
            (
                kind,
                name,
                mode,
                f"[{safe(job)}]",
                _NONE,
                _NONE,
                _NONE,
                duration(ttl),
                _NONE,
                "0",
                "0",
            )
            for mode, job, ttl in jobs
        ]
    if not entry.holders:
        fence = _count(entry.fence)
        return [(kind, name, _NONE, _NONE, _NONE, _NONE, fence, _NONE, _NONE, waiters, parked)]
    return [
        (
            kind,
            name,
            h.mode,
            holder_label(h),
            host_label(h),
            _count(h.pid),
            _count(h.fence),
            duration(h.ttl_ms),
            duration(h.held_ms),
            waiters,
            parked,
        )
        for h in entry.holders
    ]


def parked_rows(runs: Iterable[ParkedRun]) -> list[tuple[str, ...]]:
    """Rows of parked runs, in :data:`PARKED_COLUMNS` order."""
    return [
        (
            safe(r.id),
            r.kind.value,
            safe(r.name),
            task_label(r.task_name, r.task_id) if r.task_id else _NONE,
            "in flight" if r.in_flight else _count(r.position),
            duration(r.waited_ms),
        )
        for r in runs
    ]


def waiter_rows(waiters: Iterable[Waiter]) -> list[tuple[str, ...]]:
    """Rows of blocked callers, in :data:`WAITER_COLUMNS` order."""
    return [
        (
            task_label(w.task_name, w.task_id) if w.task_id else safe(w.token),
            w.mode,
            duration(w.waited_ms),
        )
        for w in waiters
    ]


def render(columns: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "") -> list[str]:
    """Lines of an aligned table: a header, then the rows (cells already
    :func:`safe`); numbers aligned right, no trailing blanks."""
    rows = [tuple(r) for r in rows]
    widths = [max([width(c)] + [width(r[i]) for r in rows]) for i, c in enumerate(columns)]
    lines = []
    for row in [tuple(columns), *rows]:
        cells = []
        for i, cell in enumerate(row):
            pad = " " * (widths[i] - width(cell))
            cells.append(pad + cell if columns[i] in NUMERIC else cell + pad)
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


HOLDER_COLUMNS = ("MODE", "HOLDER", "HOST", "PID", "FENCE", "TTL", "HELD", "TOKEN")


def show_lines(entry: Entry, waiters: list[Waiter], runs: list[ParkedRun]) -> list[str]:
    """What ``show`` prints of one entry: its facts, then its holders, waiters and parked runs."""
    name = safe(entry.name)
    if entry.kind is Kind.UNIQUE:
        u = entry.unique or UniqueJobs(None, 0, None, 0, None, 0)
        out = [f"unique {name}", f"  key: {safe(entry.key)}:unique"]
        for label, job, ttl in (
            ("waiting", u.waiting, u.waiting_ttl_ms),
            ("running", u.running, u.running_ttl_ms),
            ("throttle", u.throttled_by, u.throttle_ttl_ms),
        ):
            shown = f"[{safe(job)}] ({duration(ttl)} left)" if job else "-"
            out.append(f"  {label}: {shown}")
        return out
    out = [f"{entry.kind.value} {name}", f"  key: {safe(entry.key)}"]
    out.append(f"  fence: {entry.fence if entry.fence is not None else '-'}")
    if entry.limit is not None:
        out.append(f"  limit: {entry.limit}")
    if entry.kind is Kind.RWLOCK:
        out.append(f"  writers waiting: {entry.writers_waiting}")
    if entry.holders:
        out.append(f"  holders ({len(entry.holders)}):")
        rows = [(*row[2:9], safe(h.token)) for h, row in zip(entry.holders, entry_rows(entry))]
        out += render(HOLDER_COLUMNS, rows, indent="    ")
    else:
        out.append("  holders: none")
    if waiters:
        out.append(f"  waiters ({len(waiters)}):")
        out += render(WAITER_COLUMNS, waiter_rows(waiters), indent="    ")
    else:
        out.append("  waiters: none")
    if runs:
        out.append(f"  parked runs ({len(runs)}):")
        out += render(PARKED_COLUMNS, parked_rows(runs), indent="    ")
    else:
        out.append("  parked runs: none")
    return out
