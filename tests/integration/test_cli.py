"""``celery -A tests.celery_app redislock ls|show|release|parked|stats|top``, run for real.

Each command runs as a subprocess against the session's redis-server while
real holds exist: a lock held by a locked task running in a prefork worker
(its holder names the task, ``celery@<host>`` and the pool process's pid), a
semaphore and a read-write lock held from this process, unique keys, a
parked run.  ``top`` runs in a tmux pane.  Set REDISLOCK_CLI_CAPTURES to a
file to have the ``ls`` and ``top`` screens appended to it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import pytest
import redis

from celery_redislock import LockLost, ReadWriteLock, Semaphore
from celery_redislock.inspect import Entry, Inspector, Kind
from celery_redislock.primitives import Lock, Primitive, keys
from tests.helpers import wait_until
from tests.integration.task_helpers import start_worker, uniq
from tests.workers import Worker

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = [
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
]
#: How long the scene's task runs hold (the worker is killed at the end).
LONG = 300.0


def cli(
    base: str, *args: str, input: Optional[str] = None, env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.celery_app redislock *args``, run to its end."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.celery_app", "redislock", *args],
        cwd=ROOT,
        env=cli_env(base, env),
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def cli_env(base: str, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    return {**os.environ, "REDISLOCK_TEST_REDIS": base, "PYTHONPATH": str(ROOT), **(extra or {})}


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def table(lines: list[str]) -> list[dict[str, str]]:
    """The rows of an aligned table (cells are apart by two blanks or more)."""
    header = re.split(r"\s{2,}", lines[0].strip())
    rows = []
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(header), f"{line!r} does not fit {header}"
        rows.append(dict(zip(header, cells)))
    return rows


def ms(text: str) -> int:
    """A duration as the command prints it (``850ms``, ``4.8s``, ``2m05s``, ``1h02m``) in ms."""
    m = re.fullmatch(r"(\d+)ms|(\d+(?:\.\d)?)s|(\d+)m(\d\d)s|(\d+)h(\d\d)m", text)
    assert m is not None, text
    g = m.groups()
    if g[0]:
        return int(g[0])
    if g[1]:
        return round(float(g[1]) * 1000)
    if g[2]:
        return (int(g[2]) * 60 + int(g[3])) * 1000
    return (int(g[4]) * 3600 + int(g[5]) * 60) * 1000


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


def capture(title: str, text: str) -> None:
    path = os.environ.get("REDISLOCK_CLI_CAPTURES")
    if path:
        with open(path, "a") as f:
            f.write(f"## {title}\n\n{text.rstrip()}\n\n")


def entries(locks: redis.Redis, pattern: str) -> dict[tuple[str, str], Entry]:
    return {(e.kind.value, e.name): e for e in Inspector(locks).entries(pattern)}


# -- the scene ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker(redis_base: str, uapp: ModuleType) -> Iterator[Worker]:
    """A prefork worker named ``celery@<host>`` running tests.unique_app (its tasks and
    tests.celery_app's); killed at the end, as the scene's runs hold for minutes."""
    w = start_worker(redis_base, "celery", app="tests.unique_app", concurrency=5)
    yield w
    w.kill()
    w.stop()


@dataclasses.dataclass
class Scene:
    uid: str
    lock: str  # lt.fail's lock, held by ``lock_task``
    lock_task: str  # task ids
    unique: str  # u.finished: a lock and a unique key, both held by ``unique_task``
    unique_task: str
    park: str  # u.started_park: held by ``park_holder``, ``parked_task`` parked
    park_holder: str
    parked_task: str
    sem: str
    sem_holds: list[Primitive]
    rw: str
    rw_hold: Primitive

    @property
    def pattern(self) -> str:
        return f"*{self.uid}*"


@pytest.fixture(scope="module")
def scene(
    capp: ModuleType, uapp: ModuleType, worker: Worker, locks: redis.Redis
) -> Iterator[Scene]:
    uid = uniq("cli")
    tag = uniq("cli")
    sem = f"{uid}-sem"
    sem_holds: list[Primitive] = [Semaphore(locks, sem, 3, ttl=30) for _ in range(2)]
    for hold in sem_holds:
        assert hold.acquire(timeout=5)
    rw = f"{uid}-rw"
    rw_hold: Primitive = ReadWriteLock(locks, rw, ttl=30).write()
    assert rw_hold.acquire(timeout=5)
    args = {
        "lock": (f"{uid}-a", tag, LONG),
        "unique": (f"{uid}-u", tag, LONG),
        "park": (f"{uid}-p", tag, LONG),
    }
    # Ids only: a pending AsyncResult kept to the end of the session would
    # unsubscribe from a server already stopped.
    lock_task = capp.lt_fail.apply_async(args["lock"]).id
    unique_task = uapp.finished.apply_async(args["unique"]).id
    park_holder = uapp.started_park.apply_async(args["park"]).id
    names = {
        "lock": capp.lt_fail.lock_name_for(args["lock"], {}),
        "unique": uapp.finished.lock_name_for(args["unique"], {}),
        "park": uapp.started_park.lock_name_for(args["park"], {}),
    }

    def holder(name: str) -> Optional[str]:
        e = entries(locks, f"*{uid}*").get(("lock", name))
        return e.holders[0].task_id if e is not None and e.holders else None

    wait_until(lambda: holder(names["park"]) == park_holder, 20, 0.05, "the park holder")
    parked_task = uapp.started_park.apply_async(args["park"]).id
    wait_until(lambda: holder(names["lock"]) == lock_task, 20, 0.05, "lt.fail's hold")
    wait_until(lambda: holder(names["unique"]) == unique_task, 20, 0.05, "u.finished's hold")
    wait_until(
        lambda: entries(locks, f"*{uid}*")[("lock", names["park"])].parked == 1,
        20,
        0.05,
        "the parked run",
    )
    yield Scene(
        uid,
        names["lock"],
        lock_task,
        names["unique"],
        unique_task,
        names["park"],
        park_holder,
        parked_task,
        sem,
        sem_holds,
        rw,
        rw_hold,
    )
    for hold in [*sem_holds, rw_hold]:
        hold.release()
    for key in locks.scan_iter(match=f"redislock:{{*{uid}*"):
        locks.delete(key)


def host() -> str:
    return f"celery@{socket.gethostname()}"


# -- ls ------------------------------------------------------------------------------


def test_ls_prints_a_row_per_hold_with_its_task_worker_and_pid(
    redis_base: str, scene: Scene, worker: Worker
) -> None:
    out = ok(cli(redis_base, "ls", "--pattern", scene.pattern))
    capture("celery redislock ls", out)
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == COLUMNS
    rows = table(lines)
    by = {(r["KIND"], r["NAME"], r["HOLDER"]): r for r in rows}
    assert len(rows) == len(by) == 8  # 3 locks, 2 permits, 1 write side, 2 unique jobs

    lock = by["lock", scene.lock, f"lt.fail[{scene.lock_task}]"]
    assert lock["MODE"] == "exclusive"
    assert lock["HOST"] == host()
    assert parent_of(int(lock["PID"])) == worker.proc.pid  # a pool process of the worker
    assert 0 < ms(lock["TTL"]) <= 5000  # tests.celery_app's redislock_lock_ttl
    assert ms(lock["HELD"]) > 0
    assert (lock["WAITERS"], lock["PARKED"]) == ("0", "0")

    park = by["lock", scene.park, f"u.started_park[{scene.park_holder}]"]
    assert (park["HOST"], park["WAITERS"], park["PARKED"]) == (host(), "0", "1")
    assert int(park["PID"]) != int(lock["PID"])

    permits = [r for r in rows if r["KIND"] == "semaphore"]
    assert sorted(r["HOLDER"] for r in permits) == sorted(h.token for h in scene.sem_holds)
    assert {(r["NAME"], r["MODE"], r["HOST"], r["PID"]) for r in permits} == {
        (scene.sem, "permit", "-", "-")
    }
    assert sorted(int(r["FENCE"]) for r in permits) == sorted(h.fence for h in scene.sem_holds)
    write = by["rwlock", scene.rw, scene.rw_hold.token]
    assert (write["MODE"], write["FENCE"]) == ("write", str(scene.rw_hold.fence))

    running = by["unique", scene.unique, f"[{scene.unique_task}]"]
    assert (running["MODE"], running["FENCE"], running["HELD"]) == ("running", "-", "-")
    waiting = by["unique", scene.park, f"[{scene.parked_task}]"]
    assert waiting["MODE"] == "waiting"
    assert ms(waiting["TTL"]) > 60_000  # a waiting job's key outlives any lease

    # Kinds in order, names sorted within a kind.
    order = [(r["KIND"], r["NAME"]) for r in rows]
    kinds = ["lock", "semaphore", "rwlock", "unique"]
    assert order == sorted(order, key=lambda kn: (kinds.index(kn[0]), kn[1]))


def test_ls_json_is_the_entries_schema(redis_base: str, scene: Scene, worker: Worker) -> None:
    data = json.loads(ok(cli(redis_base, "ls", "--json", "--pattern", scene.pattern)))
    assert isinstance(data, list)
    found = {(e["kind"], e["name"]): e for e in data}
    assert sorted(found) == sorted(
        [
            ("lock", scene.lock),
            ("lock", scene.unique),
            ("lock", scene.park),
            ("semaphore", scene.sem),
            ("rwlock", scene.rw),
            ("unique", scene.unique),
            ("unique", scene.park),
        ]
    )
    keys_of_entry = [
        "kind",
        "name",
        "key",
        "holders",
        "fence",
        "limit",
        "waiters",
        "parked",
        "writers_waiting",
        "unique",
    ]
    assert all(list(e) == keys_of_entry for e in data)
    lock = found["lock", scene.lock]
    (holder,) = lock["holders"]
    assert list(holder) == [
        "token",
        "mode",
        "fence",
        "ttl_ms",
        "held_ms",
        "task_id",
        "task_name",
        "hostname",
        "pid",
        "parked",
    ]
    assert holder["task_id"] == scene.lock_task
    assert holder["task_name"] == "lt.fail"
    assert holder["hostname"] == host()
    assert parent_of(holder["pid"]) == worker.proc.pid
    assert holder["token"].startswith(f"{scene.lock_task}|{host()}|{holder['pid']}|lt.fail|")
    assert holder["fence"] == lock["fence"]
    assert 0 < holder["ttl_ms"] <= 5000 and holder["held_ms"] > 0 and holder["parked"] is False
    assert lock["key"] == keys.tag("redislock", scene.lock)

    sem = found["semaphore", scene.sem]
    assert (sem["limit"], len(sem["holders"])) == (3, 2)
    assert {h["mode"] for h in sem["holders"]} == {"permit"}
    assert found["rwlock", scene.rw]["holders"][0]["mode"] == "write"
    assert found["lock", scene.park]["parked"] == 1
    assert found["unique", scene.unique]["unique"]["running"] == scene.unique_task
    assert found["unique", scene.park]["unique"]["waiting"] == scene.parked_task


def test_ls_filters_by_kind_and_pattern(redis_base: str, scene: Scene) -> None:
    rows = table(ok(cli(redis_base, "ls", "--kind", "semaphore")).splitlines())
    assert {r["KIND"] for r in rows} == {"semaphore"}
    assert [r["NAME"] for r in rows].count(scene.sem) == 2
    only = table(ok(cli(redis_base, "ls", "--pattern", f"{scene.uid}-r*")).splitlines())
    assert [(r["KIND"], r["NAME"]) for r in only] == [("rwlock", scene.rw)]
    data = json.loads(
        ok(cli(redis_base, "ls", "--json", "--kind", "unique", "--pattern", scene.pattern))
    )
    assert sorted(e["name"] for e in data) == sorted([scene.unique, scene.park])
    assert {e["kind"] for e in data} == {"unique"}
    assert ok(cli(redis_base, "ls", "--pattern", f"{scene.uid}-nothing*")) == "nothing in use\n"


def test_ls_kind_parked_lists_the_parked_runs(redis_base: str, scene: Scene) -> None:
    rows = table(
        ok(cli(redis_base, "ls", "--kind", "parked", "--pattern", scene.pattern)).splitlines()
    )
    assert len(rows) == 1
    (row,) = rows
    assert row["ID"].startswith(f"{scene.parked_task}|")
    assert (row["KIND"], row["NAME"], row["POSITION"]) == ("lock", scene.park, "0")
    assert row["TASK"] == f"u.started_park[{scene.parked_task}]"
    runs = json.loads(
        ok(cli(redis_base, "ls", "--kind", "parked", "--json", "--pattern", scene.pattern))
    )
    assert [(r["id"], r["task_id"], r["position"], r["in_flight"]) for r in runs] == [
        (row["ID"], scene.parked_task, 0, False)
    ]
    assert list(runs[0]) == [
        "id",
        "name",
        "kind",
        "task_id",
        "task_name",
        "position",
        "waited_ms",
        "in_flight",
    ]


# -- show, stats ---------------------------------------------------------------------


def test_show_prints_every_entry_of_a_name(redis_base: str, scene: Scene) -> None:
    out = ok(cli(redis_base, "show", scene.park))
    lines = out.splitlines()
    assert lines[0] == f"lock {scene.park}"
    assert f"  key: redislock:{{{scene.park}}}" in lines
    at = lines.index("  holders (1):")
    (holder,) = table(lines[at + 1 : at + 3])
    assert holder["HOLDER"] == f"u.started_park[{scene.park_holder}]"
    assert holder["HOST"] == host()
    assert holder["TOKEN"].startswith(f"{scene.park_holder}|{host()}|{holder['PID']}|")
    assert "  waiters: none" in lines
    at = lines.index("  parked runs (1):")
    (run,) = table(lines[at + 1 : at + 3])
    assert run["TASK"] == f"u.started_park[{scene.parked_task}]"
    # The same name is a unique key too: shown after a blank line.
    at = lines.index(f"unique {scene.park}")
    assert lines[at - 1] == ""
    assert lines[at + 2].startswith(f"  waiting: [{scene.parked_task}] (")
    assert lines[at + 3 :] == ["  running: -", "  throttle: -"]

    data = json.loads(ok(cli(redis_base, "show", scene.park, "--json")))
    assert data["name"] == scene.park
    assert [e["kind"] for e in data["entries"]] == ["lock", "unique"]
    line = data["entries"][0]["line"]
    assert line["waiters"] == []
    assert [r["task_id"] for r in line["parked"]] == [scene.parked_task]
    assert data["entries"][1]["line"] == {"waiters": [], "parked": []}

    sem = ok(cli(redis_base, "show", scene.sem)).splitlines()
    assert sem[:5] == [
        f"semaphore {scene.sem}",
        f"  key: redislock:{{{scene.sem}}}",
        f"  fence: {max(h.fence for h in scene.sem_holds)}",
        "  limit: 3",
        "  holders (2):",
    ]


def test_show_and_release_of_an_unknown_name_exit_1(redis_base: str, scene: Scene) -> None:
    for args in (["show", f"{scene.uid}-nope"], ["release", f"{scene.uid}-nope", "--yes"]):
        result = cli(redis_base, *args)
        assert result.returncode == 1
        assert result.stdout == ""
        assert result.stderr == (
            f"no lock, semaphore, read-write lock or unique key named '{scene.uid}-nope'\n"
        )
    result = cli(redis_base, "release", scene.sem, "--holder", "nobody", "--yes")
    assert (result.returncode, result.stderr) == (1, f"no holder 'nobody' of '{scene.sem}'\n")


def test_stats_counts_kinds_and_finds_the_oldest_hold(redis_base: str, scene: Scene) -> None:
    data = json.loads(ok(cli(redis_base, "stats", "--json", "--pattern", scene.pattern)))
    counts = {"lock": 3, "semaphore": 1, "rwlock": 1, "unique": 2}
    assert data["counts"] == counts and data["held"] == counts
    assert (data["holders"], data["waiters"], data["parked"]) == (6, 0, 1)
    # The permits were taken first, before any task ran.
    assert data["oldest"]["kind"] == "semaphore" and data["oldest"]["name"] == scene.sem
    assert data["oldest"]["holder"]["token"] == scene.sem_holds[0].token
    assert data["longest_line"] == {"kind": "lock", "name": scene.park, "waiting": 1}

    lines = ok(cli(redis_base, "stats", "--pattern", scene.pattern)).splitlines()
    assert table(lines[:5]) == [
        {"KIND": "lock", "NAMES": "3", "HELD": "3"},
        {"KIND": "semaphore", "NAMES": "1", "HELD": "1"},
        {"KIND": "rwlock", "NAMES": "1", "HELD": "1"},
        {"KIND": "unique", "NAMES": "2", "HELD": "2"},
    ]
    assert lines[5] == "holders 6, waiters 0, parked runs 1"
    assert lines[6].startswith(
        f"oldest hold: semaphore {scene.sem} by {scene.sem_holds[0].token}, held "
    )
    assert lines[7] == f"longest line: lock {scene.park}, 0 waiting, 1 parked"


def test_names_are_printed_safely(redis_base: str, scene: Scene, locks: redis.Redis) -> None:
    name = f"{scene.uid}-evil\x1b[2J\x1b[H\nforged row\r"
    lock = Lock(locks, name, ttl=10)
    assert lock.acquire(timeout=5)
    try:
        out = ok(cli(redis_base, "ls", "--pattern", f"{scene.uid}-evil*"))
        assert "\x1b" not in out and "\r" not in out
        lines = out.splitlines()
        assert len(lines) == 2
        assert table(lines)[0]["NAME"] == repr(name)
        data = ok(cli(redis_base, "ls", "--json", "--pattern", f"{scene.uid}-evil*"))
        assert "\x1b" not in data
        assert json.loads(data)[0]["name"] == name
        shown = ok(cli(redis_base, "show", name))
        assert shown.splitlines()[0] == f"lock {name!r}"
    finally:
        lock.release()


def test_an_unreachable_store_exits_1(redis_base: str) -> None:
    from tests.redis_server import free_port

    dead = {"REDISLOCK_TEST_LOCK_URL": f"redis://127.0.0.1:{free_port()}/0"}
    result = cli(redis_base, "ls", env=dead)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: lock store: ")
    assert "Connection refused" in result.stderr


# -- release -------------------------------------------------------------------------


def test_release_asks_frees_the_hold_and_raises_the_fence(
    redis_base: str, capp: ModuleType, worker: Worker, locks: redis.Redis
) -> None:
    job, tag = uniq("cli-rel"), uniq("cli-rel")
    args = (job, tag, 6.0)
    result = capp.lt_fail.apply_async(args)
    name = capp.lt_fail.lock_name_for(args, {})
    ins = Inspector(locks)

    def holder() -> Any:
        shown = ins.show(name, "lock")
        return shown[0].holders[0] if shown and shown[0].holders else None

    held = wait_until(holder, 20, 0.05, "lt.fail's hold")
    assert held.task_id == result.id

    declined = cli(redis_base, "release", name, input="n\n")
    assert declined.returncode == 1
    assert declined.stderr == "Aborted!\n"
    still = holder()
    assert still is not None and still.token == held.token

    out = ok(cli(redis_base, "release", name, input="y\n")).splitlines()
    assert out[0] == "will release 1 hold(s):"
    (row,) = table(out[1:3])
    assert (row["HOLDER"], row["HOST"], row["PID"]) == (
        f"lt.fail[{result.id}]",
        host(),
        str(held.pid),
    )
    assert out[3] == f"Release 1 hold(s) of {name}? [y/N]: "
    m = re.fullmatch(
        rf"released lock {re.escape(name)}: freed lt\.fail\[{result.id}\]; "
        r"new fence (\d+) \(was (\d+)\)",
        out[4],
    )
    assert m is not None, out[4]
    new, old = int(m[1]), int(m[2])
    assert old == held.fence
    assert new > old
    assert len(out) == 5
    assert cli(redis_base, "show", name).returncode == 1  # nothing holds it now

    # The lock is free while the old run still runs: the next run takes it,
    # with a fence above the one printed.
    again = capp.lt_fail.apply_async((job, uniq("cli-rel"), 0.1)).get(timeout=20)
    assert again["fence"] > new
    # The old run learns it lost the lock: at its renewal, then at its release.
    assert result.get(timeout=20)["fence"] == old
    lock_key = keys.lock_keys("redislock", name).lock
    wait_until(
        lambda: (
            f"lt.fail[{result.id}]: lock {name!r} (fence {old}) had expired before release"
            in worker.output()
        ),
        10,
        0.05,
        "the worker's LockLost",
    )
    assert f"lock {lock_key} lost: the lease had expired or was taken over" in worker.output()


def test_release_yes_frees_one_holder_of_a_semaphore(
    redis_base: str, locks: redis.Redis, scene: Scene
) -> None:
    name = f"{scene.uid}-sem-release"
    holds = [Semaphore(locks, name, 3, ttl=10) for _ in range(2)]
    for hold in holds:
        assert hold.acquire(timeout=5)
    gone, kept = holds
    result = cli(redis_base, "release", name, "--yes", "--holder", gone.token, "--json")
    data = json.loads(ok(result))
    assert result.stderr.splitlines()[0] == "will release 1 hold(s):"  # (stdout is JSON alone)
    assert list(data) == ["name", "released"]
    (released,) = data["released"]
    assert list(released) == ["kind", "name", "fence", "freed", "unique_job"]
    assert (released["kind"], released["name"], released["unique_job"]) == (
        "semaphore",
        name,
        None,
    )
    assert [h["token"] for h in released["freed"]] == [gone.token]
    assert released["fence"] > max(gone.fence, kept.fence)
    (entry,) = Inspector(locks).show(name)
    assert [h.token for h in entry.holders] == [kept.token]
    with pytest.raises(LockLost):
        gone.release()
    kept.release()


def test_release_holder_frees_a_tasks_lock_and_its_unique_key(
    redis_base: str, uapp: ModuleType, worker: Worker, locks: redis.Redis
) -> None:
    args = (uniq("cli-uniq"), uniq("cli-uniq"), 4.0)
    result = uapp.finished.apply_async(args)
    name = uapp.finished.lock_name_for(args, {})
    ins = Inspector(locks)
    wait_until(
        lambda: (
            [e.kind for e in ins.show(name)] == [Kind.LOCK, Kind.UNIQUE]
            and ins.show(name)[0].holders
        ),
        20,
        0.05,
        "u.finished's lock and key",
    )
    lines = ok(cli(redis_base, "release", name, "--holder", result.id, "--yes")).splitlines()
    assert lines[0] == "will release 2 hold(s):"
    assert [(r["KIND"], r["HOLDER"]) for r in table(lines[1:4])] == [
        ("lock", f"u.finished[{result.id}]"),
        ("unique", f"[{result.id}]"),
    ]
    assert lines[4].startswith(f"released lock {name}: freed u.finished[{result.id}]; new fence ")
    assert lines[5] == f"released unique {name}: job [{result.id}] let go"
    assert ins.show(name) == []
    result.get(timeout=20)


# -- parked ----------------------------------------------------------------------------


def test_parked_lists_republishes_and_drops(
    redis_base: str, uapp: ModuleType, worker: Worker, locks: redis.Redis, rec: redis.Redis
) -> None:
    job, tag = uniq("cli-park"), uniq("cli-park")
    holder = uapp.started_park.apply_async((job, tag, LONG)).id  # (ids: see scene)
    name = uapp.started_park.lock_name_for((job, tag, LONG), {})
    ins = Inspector(locks)
    wait_until(lambda: ins.show(name, "lock"), 20, 0.05, "the holder")
    parked = uapp.started_park.apply_async((job, tag, 0.1)).id
    run = wait_until(lambda: ins.parked(name), 20, 0.05, "the parked run")[0]
    assert run.task_id == parked

    # `parked`, `parked NAME` and `parked ls NAME` list it; `parked NAME --json` too.
    for args in ([], [name], ["ls", name]):
        rows = table(ok(cli(redis_base, "parked", *args)).splitlines())
        assert [(r["ID"], r["NAME"], r["POSITION"]) for r in rows if r["NAME"] == name] == [
            (run.id, name, "0")
        ]
    (listed,) = json.loads(ok(cli(redis_base, "parked", name, "--json")))
    assert listed == run.as_dict() | {"waited_ms": listed["waited_ms"]}
    missing = cli(redis_base, "parked", f"{job}-nope")
    assert missing.returncode == 1
    assert missing.stderr == f"no lock, semaphore or read-write lock named '{job}-nope'\n"

    # republish ID: published again, it parks again (the lock is still held).
    out = ok(cli(redis_base, "parked", "republish", run.id))
    assert out == f"re-published parked run {run.id} of lock {name} as task {parked}\n"
    again = wait_until(
        lambda: [r for r in ins.parked(name) if r.task_id == parked], 20, 0.05, "parked again"
    )
    assert len(again) == 1

    # drop ID (by task id here): gone for good, its unique key with it.
    out = ok(cli(redis_base, "parked", "drop", parked))
    assert out == f"dropped parked run {again[0].id} (u.started_park[{parked}]) of lock {name}\n"
    assert ins.parked(name) == []
    assert [e.kind for e in ins.show(name)] == [Kind.LOCK]  # the waiting job's key let go
    result = cli(redis_base, "parked", "drop", parked)
    assert (result.returncode, result.stderr) == (1, f"no parked run '{parked}'\n")
    result = cli(redis_base, "parked", "republish", run.id)
    assert (result.returncode, result.stderr) == (1, f"no parked run '{run.id}'\n")

    # The lock is freed: a run still in line would be granted and run now; the
    # dropped one never runs.
    ok(cli(redis_base, "release", name, "--yes"))
    time.sleep(2.0)
    assert [json.loads(r)["id"] for r in rec.lrange(f"started:{tag}", 0, -1)] == [holder]
    assert ins.show(name) == []


# -- top -----------------------------------------------------------------------------


def _rows_of(screen: str) -> list[dict[str, str]]:
    lines = screen.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("KIND "))
    end = next((i for i in range(at, len(lines)) if not lines[i].strip()), len(lines))
    return table(lines[at:end])


@pytest.mark.parametrize("key", ["q", "C-c"])
def test_top_redraws_a_live_view_in_tmux_and_quits(
    redis_base: str, scene: Scene, tmp_path: Path, key: str
) -> None:
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed (apt-get install -y tmux)")
    sock = str(tmp_path / "tmux.sock")
    before, after, rc = tmp_path / "stty.before", tmp_path / "stty.after", tmp_path / "rc"
    env = [
        f"{k}={v}"
        for k, v in cli_env(redis_base).items()
        if k in ("REDISLOCK_TEST_REDIS", "PYTHONPATH")
    ]
    top = [
        "env",
        *env,
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.celery_app",
        "redislock",
        "top",
        "--pattern",
        scene.pattern,
    ]
    script = f"stty -g > {before}; cd {ROOT}; {shlex.join(top)}; echo $? > {rc}; stty -g > {after}"
    base = [tmux, "-f", "/dev/null", "-S", sock]
    subprocess.run(
        [*base, "new-session", "-d", "-x", "200", "-y", "50", "bash", "-c", script], check=True
    )
    try:

        def screen() -> str:
            out = subprocess.run(
                [*base, "capture-pane", "-p"], capture_output=True, text=True, check=True
            )
            return out.stdout

        holder = f"lt.fail[{scene.lock_task}]"
        first = wait_until(lambda: s if holder in (s := screen()) else None, 30, 0.1, "top")
        time.sleep(2.2)
        second = screen()
        capture("celery redislock top (tmux, 200x50)", second)

        assert first.splitlines()[0].startswith("redislock top - redis://127.0.0.1:")
        assert first.splitlines()[0] != second.splitlines()[0]  # its clock moved
        rows = [_rows_of(first), _rows_of(second)]
        for shown in rows:
            assert len(shown) == 8
        lock = [
            next(r for r in shown if r["HOLDER"] == holder and r["KIND"] == "lock")
            for shown in rows
        ]
        assert (lock[1]["HOST"], lock[1]["NAME"]) == (host(), scene.lock)
        assert ms(lock[1]["HELD"]) - ms(lock[0]["HELD"]) >= 1000  # it counts up
        waiting = [
            next(r for r in shown if r["MODE"] == "waiting") for shown in rows
        ]  # the parked job's unique key: a countdown
        assert 1000 <= ms(waiting[0]["TTL"]) - ms(waiting[1]["TTL"]) <= 4000
        # The longest-held first: the permits, taken before anything else.
        assert rows[1][0]["KIND"] == "semaphore"

        subprocess.run([*base, "send-keys", key], check=True)
        # (The shell creates each file as it redirects, before writing it.)
        wait_until(
            lambda: rc.exists() and after.exists() and after.read_text().endswith("\n"),
            15,
            0.05,
            "top to exit",
        )
        assert rc.read_text() == "0\n"
        assert after.read_text() == before.read_text()  # the terminal's modes given back
        wait_until(
            lambda: subprocess.run([*base, "has-session"], capture_output=True).returncode != 0,
            10,
            0.05,
            "the session to close",
        )
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True)


def test_top_without_a_terminal_prints_frames_until_ctrl_c(redis_base: str, scene: Scene) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.celery_app",
            "redislock",
            "top",
            "--interval",
            "0.3",
            "--pattern",
            scene.pattern,
        ],
        cwd=ROOT,
        env=cli_env(redis_base),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # (once it draws, Ctrl-C ends the view)
        assert first.startswith("redislock top - ")
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        text = first + proc.stdout.read()
        proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    assert proc.returncode == 0, text
    assert "\x1b" not in text
    frames = re.split(r"(?m)^(?=redislock top - )", text)[1:]
    assert len(frames) >= 3
    assert all(f"lt.fail[{scene.lock_task}]" in f for f in frames), text
