"""The demo's checks: what passes, what fails, and the exit status they give.

The figures are fabricated here; tests/integration/test_examples.py runs the
demo itself.  A failing check must make the demo exit non-zero.
"""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from celery_redislock.demo import checks


def ev(event: str, n: int) -> dict[str, Any]:
    return {"event": event, "n": n}


def test_peak_overlap_and_order_are_read_from_the_events_order() -> None:
    one_at_a_time = [ev("start", 0), ev("end", 0), ev("start", 1), ev("end", 1)]
    assert checks.peak_overlap(one_at_a_time) == 1
    assert checks.starts(one_at_a_time) == [0, 1]
    three = [ev("start", 0), ev("start", 1), ev("end", 0), ev("start", 2), ev("start", 3)]
    assert checks.peak_overlap(three) == 3
    noise = [{"event": "contended"}, {"event": "lock lost"}]
    assert checks.peak_overlap(noise) == 0 and checks.starts(noise) == []


def test_each_check_fails_on_the_figures_that_break_its_claim() -> None:
    assert checks.skip(1, 4, 5).ok
    assert not checks.skip(2, 3, 5).ok
    assert checks.park([0, 1, 2], [0, 1, 2], 2, 1).ok
    assert not checks.park([0, 2, 1], [0, 1, 2], 2, 1).ok  # out of order
    assert not checks.park([0, 1], [0, 1, 2], 2, 1).ok  # one never ran
    assert not checks.park([0, 1, 2], [0, 1, 2], 2, 2).ok  # two ran at once
    assert checks.semaphore(2, 2, 6, 6).ok and checks.semaphore(2, 1, 6, 6).ok
    assert not checks.semaphore(2, 3, 6, 6).ok
    assert checks.fence(1, False, 2, "200").ok
    assert not checks.fence(1, True, 2, "100").ok
    assert not checks.fence(None, None, None, None).ok
    assert checks.unique(5, 1, 1, 1).ok
    assert not checks.unique(5, 5, 5, 5).ok
    assert checks.retry(4, 4, 1, 3).ok and not checks.retry(4, 4, 2, 0).ok
    run = {"id": "t-1", "pid": 7, "fence": 10}
    listed = {"task": "demo.rebuild_report", "task_id": "t-1", "pid": 7}
    assert checks.operating(listed, run, 10, 11, True).ok
    assert not checks.operating(None, run, 10, 11, True).ok
    assert not checks.operating(listed, run, 10, 10, True).ok  # fence not raised
    assert not checks.operating(listed, run, 10, 11, False).ok


def test_a_failing_check_prints_expected_and_measured_and_the_status_is_1() -> None:
    failing = checks.skip(2, 3, 5)
    assert failing.line() == (
        "FAIL skip: expected 1 of 5 to run and 4 skipped; "
        "measured 2 of 5 duplicate runs ran (3 skipped with TaskSkipped)"
    )
    out = io.StringIO()
    assert checks.report([checks.unique(5, 1, 1, 1), failing], out) == 1
    assert out.getvalue() == "1 of 2 checks FAILED: skip\n"
    out = io.StringIO()
    assert checks.report([checks.unique(5, 1, 1, 1)], out) == 0
    assert out.getvalue() == "all 1 checks passed\n"
    assert checks.skip(1, 4, 5).line() == (
        "ok   skip: 1 of 5 duplicate runs ran (4 skipped with TaskSkipped)"
    )


def test_without_kombus_redis_transport_the_demo_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery_redislock.demo.__main__ import transport_missing

    assert transport_missing() is None
    monkeypatch.setitem(sys.modules, "kombu.transport.redis", None)  # as if it cannot import
    missing = transport_missing()
    assert missing and missing.endswith(": pip install 'celery-redislock[demo]'"), missing
