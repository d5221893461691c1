"""Histories of critical sections, and the checker that judges them.

Every process of a campaign records one :class:`Section` per grant: the
name, the fence, when the holder's ``acquire()`` returned and when its
critical section ended (``time.monotonic()``: one clock for every process of
a Linux machine), and how it ended: ``released``, or ``lost`` when the holder
was told its lease had run out (``LockLost`` from ``release()``, or ``lost``
set by renewal).  :func:`check` verifies four things:

1. no two holders of one mutex overlap while neither was told it had lost;
2. the holders of one semaphore never exceed its limit, counting only
   holders not told they had lost;
3. fences strictly increase per name, in the order of grants (a grant known
   to come after a section ended, by its holder's ``granted_at``, has a higher
   fence);
4. every overlap a fault made possible was detected: of every pair of
   overlapping sections of one mutex, at least one ended ``lost``.

(1 and 4 are one check seen from two sides: an overlap is allowed only when a
holder detected it.)
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Section", "Verdict", "check", "load", "save"]


@dataclass(frozen=True)
class Section:
    name: str
    limit: int  # 1 for a mutex
    fence: int
    start: float
    end: float
    outcome: str  # "released" or "lost"
    pid: int
    granted: float  # the grant happened at or after this (the holder's granted_at)


@dataclass
class Verdict:
    sections: int
    undetected_overlaps: list[tuple[Section, Section]]
    over_limit: list[tuple[str, float, int]]
    fences_back: list[tuple[Section, Section]]
    detected: list[tuple[Section, Section]]

    @property
    def detected_overlaps(self) -> int:
        return len(self.detected)

    @property
    def ok(self) -> bool:
        return not (self.undetected_overlaps or self.over_limit or self.fences_back)

    def figures(self) -> dict[str, int]:
        """The checker's totals, by name (for tests.helpers.report)."""
        return {
            "sections": self.sections,
            "detected_overlaps": self.detected_overlaps,
            "undetected_overlaps": len(self.undetected_overlaps),
            "over_limit": len(self.over_limit),
            "fences_back": len(self.fences_back),
        }

    def by_fault(self, faults: list[tuple[float, str]]) -> dict[str, dict[str, int]]:
        """The totals by the fault each finding followed: ``faults`` are
        (when it began, its kind); a finding goes to the last fault that began
        before it ("none" when none had), an overlap by the later start of
        its two sections, a fence by the later grant."""
        starts = sorted(faults)
        totals: dict[str, dict[str, int]] = {}

        def count(at: float, what: str) -> None:
            kind = "none"
            for began, name in starts:
                if began > at:
                    break
                kind = name
            row = totals.setdefault(kind, dict.fromkeys(_FINDINGS, 0))
            row[what] += 1

        for a, b in self.detected:
            count(max(a.start, b.start), "detected_overlaps")
        for a, b in self.undetected_overlaps:
            count(max(a.start, b.start), "undetected_overlaps")
        for _, at, _ in self.over_limit:
            count(at, "over_limit")
        for _, b in self.fences_back:
            count(b.granted, "fences_back")
        return totals

    def summary(self) -> str:
        return (
            f"{self.sections} sections; overlaps detected {self.detected_overlaps}, "
            f"undetected {len(self.undetected_overlaps)}; over limit "
            f"{len(self.over_limit)}; fences back {len(self.fences_back)}"
        )


_FINDINGS = ("detected_overlaps", "undetected_overlaps", "over_limit", "fences_back")


def save(path: Path, sections: Iterable[Section]) -> None:
    with path.open("a") as f:
        for s in sections:
            f.write(json.dumps(asdict(s)) + "\n")


def load(paths: Iterable[Path]) -> list[Section]:
    out = []
    for path in paths:
        if not path.exists():
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            try:
                out.append(Section(**json.loads(line)))
            except ValueError:
                if i < len(lines) - 1:
                    raise
                # The last line of a process SIGKILLed as it wrote it.
    return out


def check(sections: list[Section]) -> Verdict:
    by_name: dict[str, list[Section]] = defaultdict(list)
    for s in sections:
        by_name[s.name].append(s)
    undetected: list[tuple[Section, Section]] = []
    detected: list[tuple[Section, Section]] = []
    over: list[tuple[str, float, int]] = []
    back: list[tuple[Section, Section]] = []
    for name, group in by_name.items():
        group.sort(key=lambda s: s.start)
        limit = group[0].limit
        # 3. fences rise in grant order (acquire returned in this order; a
        # grant's fence is taken before its acquire returns).
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                if b.granted > a.end and b.fence <= a.fence:
                    back.append((a, b))  # granted after a had ended, fenced no higher
        if limit == 1:
            for i, a in enumerate(group):
                for b in group[i + 1 :]:
                    if b.start >= a.end:
                        break
                    if a.outcome == "lost" or b.outcome == "lost":
                        detected.append((a, b))
                    else:
                        undetected.append((a, b))
        else:
            events = sorted(
                [(s.start, 1) for s in group if s.outcome != "lost"]
                + [(s.end, -1) for s in group if s.outcome != "lost"],
                key=lambda e: (e[0], e[1]),
            )
            count = 0
            for at, step in events:
                count += step
                if count > limit:
                    over.append((name, at, count))
    return Verdict(len(sections), undetected, over, back, detected)
