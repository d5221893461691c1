"""celery-once 3.0.1's own tests and README, ported: the behaviour, with the
import changed (``flavour``: the shim, and celery-once itself when installed).

Upstream asserts calls on a mocked backend or reads ``qo_*`` keys; each port
asserts the behaviour those calls stand for (a publish refused or accepted,
what it returns).  Tests of internals (``get_key``, ``_get_call_args``, the
backends' ``raise_or_lock``/``clear_lock``, ``parse_url``, the File backend)
have no port: see the migration guide, "What a shim cannot copy".
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import redis
from celery import Celery, states

from tests.compat.suite_helpers import make_app

__all__ = ["make_app"]


def refused(publish: Callable[[], Any], peer: SimpleNamespace) -> bool:
    try:
        publish()
    except peer.AlreadyQueued:
        return True
    return False


def example_task(app: Celery, peer: SimpleNamespace, **options: Any) -> Any:
    @app.task(name="example", shared=False, base=peer.QueueOnce, **options)
    def example(a: int = 1) -> int:
        return a

    return example


def test_apply_async_takes_the_key(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/integration/test_tasks.py::test_apply_async and
    backends/test_redis.py::test_apply_async_queued: a publish takes the key;
    the same publish again raises AlreadyQueued."""
    example = example_task(make_app(), peer)
    example.apply_async(args=(1,))
    assert refused(lambda: example.apply_async(args=(1,)), peer)
    assert refused(lambda: example.delay(1), peer)  # test_delay_already_queued
    assert not refused(lambda: example.delay(2), peer)


def test_raise_already_queued(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/integration/test_tasks.py::test_raise_already_queued: the duplicate
    raises AlreadyQueued, with ``countdown`` and ``message`` (README, "Usage")."""
    example = example_task(make_app(), peer)
    example.delay()
    with pytest.raises(peer.AlreadyQueued) as info:
        example.delay()
    assert 59 < info.value.countdown <= 60  # ONCE default_timeout: 60
    assert info.value.message == f"Expires in {info.value.countdown} seconds"


def test_raise_already_queued_graceful(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/integration/test_tasks.py::test_raise_already_queued_graceful and
    backends/test_redis.py::test_already_queued_graceful: ``once={'graceful':
    True}`` per call returns a result of None instead of raising."""
    example = example_task(make_app(), peer)
    example.apply_async(args=(1,))
    result = example.apply_async(args=(1,), once={"graceful": True})
    assert result.result is None


def test_graceful_task_returns_a_rejected_result(make_app: Any, peer: SimpleNamespace) -> None:
    """README "graceful" on the task: the duplicate's result has id None and
    state REJECTED, as celery-once gives it (not the queued job's result)."""
    example = example_task(make_app(), peer, once={"graceful": True})
    first = example.delay(1)
    result = example.delay(1)
    assert (result.id, result.state, result.result) == (None, states.REJECTED, None)
    assert first.id is not None


def test_apply_async_timeout(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/integration/test_tasks.py::test_apply_async_timeout: ``once={'timeout':
    s}`` per call; backends/test_redis.py::test_apply_async_expired and
    test_delay_expired: the key expires after it."""
    example = example_task(make_app(), peer)
    example.apply_async(args=(1,), once={"timeout": 1})
    with pytest.raises(peer.AlreadyQueued) as info:
        example.apply_async(args=(1,))
    assert info.value.countdown <= 1
    time.sleep(1.1)
    assert not refused(lambda: example.apply_async(args=(1,)), peer)


def test_task_timeout(make_app: Any, peer: SimpleNamespace) -> None:
    """README "timeout": ``once={'timeout': s}`` on the task."""
    example = example_task(make_app(), peer, once={"timeout": 1})
    example.delay(1)
    with pytest.raises(peer.AlreadyQueued) as info:
        example.delay(1)
    assert info.value.countdown <= 1
    time.sleep(1.1)
    assert not refused(lambda: example.delay(1), peer)


def test_keys_subset(make_app: Any, peer: SimpleNamespace) -> None:
    """README "keys": ``once={'keys': ['a']}`` deduplicates on ``a`` alone."""
    app = make_app()

    @app.task(name="slow_add", shared=False, base=peer.QueueOnce, once={"keys": ["a"]})
    def slow_add(a: int, b: int) -> int:
        return a + b

    slow_add.delay(1, 1)
    assert refused(lambda: slow_add.delay(1, 2), peer)
    assert refused(lambda: slow_add.delay(a=1, b=3), peer)
    assert not refused(lambda: slow_add.delay(2, 2), peer)


def test_keys_empty_is_one_job_per_task(make_app: Any, peer: SimpleNamespace) -> None:
    """README "keys": ``once={'keys': []}``: one job, whatever the arguments."""
    app = make_app()

    @app.task(name="slow_add", shared=False, base=peer.QueueOnce, once={"keys": []})
    def slow_add(a: int, b: int) -> int:
        return a + b

    slow_add.delay(1, 1)
    assert refused(lambda: slow_add.delay(2, 2), peer)


def test_default_keys_are_every_argument(make_app: Any, peer: SimpleNamespace) -> None:
    """README "keys", by default; tests/unit/test_tasks.py::test_get_key_args_1,
    test_get_key_args_2 and test_get_key_bound_task as behaviour: positional and
    keyword arguments name one job, and a bound task's ``self`` is not one."""
    app = make_app()

    @app.task(name="args_example", shared=False, base=peer.QueueOnce)
    def args_example(a: int, b: int) -> int:
        return a + b

    @app.task(name="bound_task", shared=False, base=peer.QueueOnce, bind=True)
    def bound_task(self: Any, a: int, b: int) -> int:
        return a + b

    for task in (args_example, bound_task):
        task.apply_async(args=(1, 2))
        assert refused(lambda t=task: t.apply_async(kwargs={"a": 1, "b": 2}), peer)
        assert not refused(lambda t=task: t.apply_async(args=(2, 1)), peer)


def test_once_config(make_app: Any, peer: SimpleNamespace, redis_base: str) -> None:
    """tests/integration/test_tasks.py::test_config, test_once_config and
    test_default_timeout."""
    app = make_app()
    example = example_task(app, peer)
    assert example.once_config == app.conf.ONCE
    assert example.default_timeout == 60


def test_the_store_is_the_once_url(
    make_app: Any, peer: SimpleNamespace, redis_base: str, store: redis.Redis
) -> None:
    """backends/test_redis.py::test_init: the keys live in the Redis of
    ``ONCE['settings']['url']`` (db 4 here; the broker is db 5)."""
    example = example_task(make_app(), peer)
    example.delay(1)
    assert store.dbsize() == 1
    assert redis.Redis.from_url(f"{redis_base}/6").dbsize() == 0


@pytest.fixture
def eager(make_app: Any) -> Celery:
    return make_app(task_always_eager=True)  # type: ignore[no-any-return]


def test_eager_run_holds_then_frees_the_key(eager: Celery, peer: SimpleNamespace) -> None:
    """backends/test_redis.py::test_delay and test_apply_async (eager): the key is
    held while the body runs (upstream's body asserts it) and free after."""
    seen = []

    @eager.task(name="example", shared=False, base=peer.QueueOnce)
    def example(a: int = 1) -> None:
        seen.append(refused(lambda: example.apply_async(args=(a,), once={"graceful": False}), peer))

    example.delay(1)
    example.apply_async(args=(1,))
    assert seen == [True, True]


@pytest.mark.parametrize(
    "flavour",
    [
        "shim",
        pytest.param(
            "orig",
            marks=pytest.mark.xfail(
                strict=False, reason="celery-once's eager retry does not run again on Celery 5.3"
            ),
        ),
    ],
)
def test_eager_retry(eager: Celery, peer: SimpleNamespace) -> None:
    """tests/integration/test_tasks.py::test_retry: a retry is not refused as a
    duplicate of its own job, and the key frees after the last run."""
    runs = []

    @eager.task(
        name="example_retry", shared=False, base=peer.QueueOnce, once={"keys": []}, bind=True
    )
    def example_retry(self: Any, a: int = 0) -> int:
        runs.append(a)
        if a != 1:
            raise self.retry(kwargs={"a": 1})
        return a

    example_retry.apply_async()  # (what the first result holds varies by Celery release)
    assert runs == [0, 1]
    assert not refused(lambda: example_retry.apply_async(), peer)
    assert runs == [0, 1, 0, 1]


def test_a_subclass_around_the_call(make_app: Any, peer: SimpleNamespace) -> None:
    """README "Flask Intergration": a QueueOnce subclass whose ``__call__``
    wraps the run (an app context) keeps the behaviour."""
    app = make_app(task_always_eager=True)
    entered = []

    class ContextQueueOnce(peer.QueueOnce):  # type: ignore[misc, name-defined]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            entered.append(True)
            return super().__call__(*args, **kwargs)

    @app.task(name="sleep_task", shared=False, base=ContextQueueOnce)
    def sleep_task(value: int) -> int:
        return value

    assert sleep_task.delay(1).get() == 1
    assert entered == [True]
    lazy = make_app()

    @lazy.task(name="sleep_task", shared=False, base=ContextQueueOnce)
    def queued(value: int) -> int:
        return value

    queued.delay(1)
    assert refused(lambda: queued.delay(1), peer)
