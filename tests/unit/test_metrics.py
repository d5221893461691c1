"""ops.metrics without a worker: what the receivers count and under which labels,
the settings, the worker-start hook's question, a missing extra, the dashboard.

The receivers are fed by the library's own signals, sent here by hand; each
test counts into a registry of its own.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from celery_redislock import ConfigurationError, signals
from celery_redislock.config import from_conf
from celery_redislock.ops import metrics
from celery_redislock.ops.metrics_endpoint import client
from celery_redislock.primitives import Lock, ReadWriteLock, Semaphore
from celery_redislock.tasks import targets

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "celery-redislock.json"


class Task:
    """What the receivers read of a LockedTask: its name and guard options."""

    def __init__(self, name: str, **options: Any) -> None:
        self.name = name
        self.semaphore = options.get("semaphore")
        self.concurrency_group = options.get("concurrency_group")
        self.lock_mode = options.get("lock_mode")
        self.lock_name = None

    def lock_key_for(self, args: Any, kwargs: Any) -> str:
        return ""


LOCK, SEM, RW = Task("t.lock"), Task("t.sem", semaphore=3), Task("t.rw", lock_mode="read")
GROUP = Task("t.group", concurrency_group="api")


@pytest.mark.parametrize("task", [LOCK, SEM, RW, GROUP], ids=lambda t: t.name)
def test_the_kind_label_follows_the_primitive_a_run_takes(task: Task) -> None:
    kind = targets.target(task, (), {})[1]
    assert targets.kind_of(task) == kind
    assert metrics.Metrics(CollectorRegistry()).labels_of(task) == (task.name, kind.value)


@pytest.fixture
def counted() -> Iterator[tuple[metrics.Metrics, CollectorRegistry]]:
    registry = CollectorRegistry()
    m = metrics.Metrics(registry)
    m.connect()
    yield m, registry
    m.disconnect()


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def send_everything(keys: list[str]) -> None:
    """Every signal the metrics count, once per key, for each kind of task."""
    client_ = redis.Redis()  # never connects: the primitives only carry their type
    for key in keys:
        for t in (LOCK, SEM, RW):
            signals.lock_acquired.send(
                sender=t, request=None, key=key, name=key, fence=1, waited=0.02
            )
            for policy in ("skip", "park", "wait, then retry"):
                signals.lock_contended.send(
                    sender=t, request=None, key=key, name=key, holder="h", ttl_ms=5, policy=policy
                )
            signals.task_skipped.send(sender=t, request=None, key=key, name=key, holder="h")
            signals.task_republished.send(sender=t, task_id=key, task_name=t.name)
            signals.lock_released.send(sender=t, request=None, key=key, name=key, fence=1, held=0.3)
            signals.lock_lost.send(sender=t, key=key, reason="gone", lock=Lock(client_, key))
        signals.task_duplicate.send(
            sender=LOCK, key=key, task_id=key, existing_id="x", action="return"
        )
    client_.close()


def counted_for(keys: list[str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    m = metrics.Metrics(registry)
    m.connect()
    try:
        send_everything(keys)
    finally:
        m.disconnect()
    return samples(registry)


def test_every_series_is_a_task_and_a_kind_never_a_key() -> None:
    keys = [f"key-{i}" for i in range(40)]
    found = counted_for(keys)
    allowed = {"task", "kind", "policy", "action", "le"}
    assert {name for _, labels in found for name, _ in labels} <= allowed
    values = {value for _, labels in found for _, value in labels}
    assert not values & set(keys)
    # As many series for forty keys as for one.
    assert found.keys() == counted_for(["k"]).keys()
    kinds = {dict(labels).get("kind") for _, labels in found} - {None}
    assert kinds == {"lock", "semaphore", "rwlock"}

    def total(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted(labels.items())))]

    n = float(len(keys))
    assert total("celery_redislock_acquired_total", task="t.sem", kind="semaphore") == n
    assert total("celery_redislock_contended_total", task="t.rw", kind="rwlock", policy="skip") == n
    assert (
        total(
            "celery_redislock_contended_total",
            task="t.lock",
            kind="lock",
            policy="wait, then retry",
        )
        == n
    )
    assert total("celery_redislock_parked_total", task="t.lock", kind="lock") == n
    assert total("celery_redislock_skipped_total", task="t.lock", kind="lock") == n
    assert total("celery_redislock_republished_total", task="t.rw", kind="rwlock") == n
    assert total("celery_redislock_lost_total", task="t.sem", kind="semaphore") == n
    assert total("celery_redislock_duplicates_total", task="t.lock", action="return") == n
    assert total("celery_redislock_wait_seconds_count", task="t.lock", kind="lock") == n
    assert total("celery_redislock_wait_seconds_sum", task="t.lock", kind="lock") == pytest.approx(
        0.02 * n
    )
    assert total("celery_redislock_hold_seconds_count", task="t.rw", kind="rwlock") == n
    assert total("celery_redislock_hold_seconds_bucket", task="t.rw", kind="rwlock", le="0.25") == 0
    assert total("celery_redislock_hold_seconds_bucket", task="t.rw", kind="rwlock", le="0.5") == n


def test_a_lease_reported_twice_is_lost_once(counted: Any) -> None:
    _, registry = counted
    client_ = redis.Redis()
    lease = Lock(client_, "x")
    lease.granted_at = 100.0
    for _ in range(2):  # renewal found it gone, then its release did
        signals.lock_lost.send(sender=LOCK, key=lease.key, reason="gone", lock=lease)
    lease.granted_at = 200.0  # the same object, held again and lost again
    signals.lock_lost.send(sender=LOCK, key=lease.key, reason="gone", lock=lease)
    # Bare primitives (no task): their own kind.
    signals.lock_lost.send(sender=None, key="s", reason="gone", lock=Semaphore(client_, "s", 2))
    signals.lock_lost.send(
        sender=None, key="r", reason="gone", lock=ReadWriteLock(client_, "r").read()
    )
    client_.close()
    lost = {
        labels: value
        for (name, labels), value in samples(registry).items()
        if name == "celery_redislock_lost_total"
    }
    assert lost == {
        (("kind", "lock"), ("task", "t.lock")): 2.0,
        (("kind", "semaphore"), ("task", "")): 1.0,
        (("kind", "rwlock"), ("task", "")): 1.0,
    }


def test_a_republished_run_of_a_task_this_process_does_not_know(counted: Any) -> None:
    _, registry = counted
    signals.task_republished.send(sender=None, task_id="i", task_name="other.task")
    assert samples(registry) == {
        ("celery_redislock_republished_total", (("kind", ""), ("task", "other.task"))): 1.0
    }


def test_disconnected_nothing_is_counted() -> None:
    registry = CollectorRegistry()
    m = metrics.Metrics(registry)
    m.connect()
    m.disconnect()
    signals.lock_acquired.send(sender=LOCK, request=None, key="k", name="k", fence=1, waited=0.1)
    assert samples(registry) == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("9100", "redislock_metrics_port must be None or an int >= 0, got '9100'"),
        (-1, "redislock_metrics_port must be None or an int >= 0, got -1"),
        (True, "redislock_metrics_port must be None or an int >= 0, got True"),
        (9100.0, "redislock_metrics_port must be None or an int >= 0, got 9100.0"),
        (65536, "redislock_metrics_port must be a port, 1 to 65535 (0: off), got 65536"),
    ],
)
def test_a_bad_port_names_the_setting_and_the_value(value: Any, message: str) -> None:
    conf = {"redislock_url": "redis://localhost/0", "redislock_metrics_port": value}
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        from_conf(conf)


def test_ports_and_addresses_accepted() -> None:
    base = {"redislock_url": "redis://localhost/0"}
    assert from_conf(base).metrics_port is None
    assert from_conf({**base, "redislock_metrics_port": 0}).metrics_port == 0
    assert from_conf({**base, "redislock_metrics_port": 9808}).metrics_port == 9808
    assert from_conf(base).metrics_addr == "0.0.0.0"
    with pytest.raises(ConfigurationError, match="redislock_metrics_addr must be a non-empty str"):
        from_conf({**base, "redislock_metrics_addr": ""})


@pytest.mark.parametrize(
    ("conf", "wanted"),
    [
        ({}, False),
        ({"redislock_metrics_port": None}, False),
        ({"redislock_metrics_port": 0}, False),
        ({"redislock_metrics_port": 9808}, True),
        ({"redislock_metrics_port": "http"}, True),  # for the worker step to refuse
        ({"REDISLOCK_METRICS_PORT": 9808}, True),
    ],
)
def test_the_worker_start_hook_asks_for_the_metrics_step(
    conf: dict[str, Any], wanted: bool
) -> None:
    assert metrics.wanted(SimpleNamespace(conf=conf)) is wanted


def test_without_prometheus_client_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigurationError) as info:
        client("redislock_metrics_port=9808")
    assert str(info.value) == (
        "redislock_metrics_port=9808 needs prometheus_client: "
        "pip install 'celery-redislock[prometheus]'"
    )
    with pytest.raises(ConfigurationError, match=re.escape("celery-redislock[prometheus]")):
        metrics.Metrics(CollectorRegistry())


def exported() -> set[str]:
    """Every sample name the metrics expose."""
    registry = CollectorRegistry()
    metrics.Metrics(registry)
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        else:
            names.update(f"{family.name}_{part}" for part in ("bucket", "count", "sum"))
    return names


def expressions(node: Any) -> Iterator[str]:
    """Every PromQL expression of a dashboard: panel targets and variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition", "query") and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def test_the_dashboard_queries_only_metrics_we_export() -> None:
    dashboard = json.loads(DASHBOARD.read_text("utf-8"))
    exprs = list(expressions(dashboard))
    assert len(exprs) >= 20
    used = {m for e in exprs for m in re.findall(r"\b[a-z_]+_(?:total|bucket|count|sum)\b", e)}
    names = exported()
    assert used <= names, used - names
    # Every metric has a panel; no panel groups or filters by a lock key.
    families = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in names}
    assert families <= {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in used}
    assert not [e for e in exprs if re.search(r"\bkey\b", e)]
    # Every other word that looks like one of ours is one of ours.
    words = {w for e in exprs for w in re.findall(r"\bcelery_redislock_\w+", e)}
    assert words <= names, words - names
