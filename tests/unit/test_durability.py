"""Pure logic of the parked-runs safety net: the persistence verdict, the bounded memory."""

from __future__ import annotations

from types import SimpleNamespace

from celery_redislock.primitives import Lock
from celery_redislock.tasks import durability, park_recovery


def test_verdict_names_what_a_restart_loses() -> None:
    assert durability.verdict("yes", "") is None
    assert durability.verdict("yes", "3600 1") is None
    bare = durability.verdict("no", "")
    assert bare is not None and "every parked run" in bare
    rdb = durability.verdict("no", "3600 1 300 100")
    assert rdb is not None and "since its last snapshot" in rdb


def _prim(name: str) -> Lock:
    return Lock(object(), name, renew=False)


def test_memory_keeps_the_newest_runs_within_its_count_and_bytes() -> None:
    task = SimpleNamespace(name="t")
    mem = park_recovery.Memory(max_runs=3, max_bytes=1000)
    for i in range(5):
        mem.add(f"tok{i}", task, f"id{i}", _prim("n"), b"x" * 10)
    assert [t for t, _ in mem.snapshot()] == ["tok2", "tok3", "tok4"]
    assert mem.bytes == 30
    mem.add("big", task, "idb", _prim("n"), b"y" * 990)  # 1020 bytes: the oldest go
    assert [t for t, _ in mem.snapshot()] == ["tok4", "big"]
    assert mem.bytes == 1000
    mem.forget(["tok4", "unknown"])
    assert [t for t, _ in mem.snapshot()] == ["big"] and mem.bytes == 990


def test_watch_tells_a_lost_store_from_a_restarted_one() -> None:
    w = park_recovery.Watch()
    assert w.after_sweep("e1", "r1") is None  # first sight
    assert w.after_sweep("e1", "r1") is None
    restarted = w.after_sweep("e1", "r2")
    assert restarted is not None and restarted.startswith("restarted")
    lost = w.after_sweep("e2", "r3")
    assert lost is not None and lost.startswith("lost its data")
