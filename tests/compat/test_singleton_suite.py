"""celery-singleton 0.3.1's own tests, ported: the behaviour, with the import
changed (``flavour``: the shim, and celery-singleton itself when installed).

Upstream reads ``SINGLETONLOCK_*`` keys, mocks ``util.generate_lock`` or the
backend, or reads ``Config``; each port asserts the behaviour those stand
for.  The runs on a worker (``test__queue_duplicate_after_success`` and
``..._after_error``) are in test_worker_fixes.py.  Tests of internals
(``generate_lock``, ``aquire_lock``, ``get_existing_task_id``, the backends,
``singleton_backend_class``, ``singleton_key_prefix``, ``Config``) have no
port: see the migration guide, "What a shim cannot copy".
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import redis
from celery import Celery
from celery import Task as BaseTask

from tests.compat.suite_helpers import make_app

__all__ = ["make_app"]


class ExpectedTaskFail(Exception):
    pass


def simple(app: Celery, peer: SimpleNamespace, **options: Any) -> Any:
    @app.task(name="simple_task", base=peer.Singleton, shared=False, **options)
    def simple_task(*args: Any) -> Any:
        return args

    return simple_task


def test__queue_duplicates__same_id(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestSimpleTask::test__queue_duplicates__same_id"""
    simple_task = simple(make_app(), peer)
    tasks = [simple_task.apply_async(args=[1, 2, 3]) for i in range(10)]
    assert set(tasks) == {tasks[0]}


def test__queue_multiple_uniques__different_ids(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestSimpleTask::test__queue_multiple_uniques__different_ids"""
    simple_task = simple(make_app(), peer)
    tasks = [simple_task.apply_async(args=[i, i + 1, i + 2]) for i in range(5)]
    assert len(set(tasks)) == len(tasks)


def test__apply_async_fails__lock_cleared(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestSimpleTask::test__apply_async_fails__lock_cleared:
    a publish whose send fails leaves the key free (the next publish is sent)."""
    simple_task = simple(make_app(), peer)
    failing = mock.patch.object(BaseTask, "apply_async", side_effect=Exception("Apply async error"))
    with failing, pytest.raises(Exception, match="Apply async error"):
        simple_task.apply_async(args=[1, 2, 3])
    first = simple_task.apply_async(args=[1, 2, 3])
    assert simple_task.apply_async(args=[1, 2, 3]) == first  # (and that one holds it)


def test__apply_async_fails__exception_reraised(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestSimpleTask::test__apply_async_fails__exception_reraised"""
    simple_task = simple(make_app(), peer)
    failing = mock.patch.object(BaseTask, "apply_async", side_effect=ExpectedTaskFail("error"))
    with failing, pytest.raises(ExpectedTaskFail):
        simple_task.apply_async(args=[1, 2, 3])


def test__raise_on_duplicate__raises_duplicate_error(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestSimpleTask::test__raise_on_duplicate__raises_duplicate_error"""
    app = make_app()

    @app.task(shared=False, base=peer.Singleton, raise_on_duplicate=True)
    def raise_on_duplicate_task(*args: Any) -> Any:
        return args

    t1 = raise_on_duplicate_task.delay(1, 2, 3)
    with pytest.raises(peer.DuplicateTaskError) as exinfo:
        raise_on_duplicate_task.delay(1, 2, 3)
    assert exinfo.value.task_id == t1.task_id


def test__clear_locks(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestClearLocks::test__clear_locks: after
    ``clear_locks(app)`` every job may be queued again (upstream: no key left)."""
    app = make_app()
    simple_task = simple(app, peer)
    first = [simple_task.apply_async(args=[i]) for i in range(5)]
    peer.clear_locks(app)
    again = [simple_task.apply_async(args=[i]) for i in range(5)]
    assert not {r.id for r in first} & {r.id for r in again}


def test__unique_on_pos_arg__lock_on_unique_args_only(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestUniqueOn::test__unique_on_pos_arg__lock_on_unique_args_only"""
    app = make_app()

    @app.task(shared=False, base=peer.Singleton, unique_on=["a", "c"])
    def unique_on_args_task(a: int, b: int, c: int, d: int = 4) -> int:
        return a * b * c * d

    first = unique_on_args_task.delay(2, 3, 4, 5)
    assert unique_on_args_task.delay(2, 9, 4, 9) == first
    assert unique_on_args_task.delay(2, 3, 5, 5) != first


def test__unique_on_kwargs__lock_on_unique_args_only(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestUniqueOn::test__unique_on_kwargs__lock_on_unique_args_only"""
    app = make_app()

    @app.task(shared=False, base=peer.Singleton, unique_on=["b", "d"])
    def unique_on_kwargs_task(a: int, b: int = 2, c: int = 3, d: int = 4) -> int:
        return a * b * c * d

    first = unique_on_kwargs_task.delay(2, b=3, c=4, d=5)
    assert unique_on_kwargs_task.delay(7, b=3, c=8, d=5) == first
    assert unique_on_kwargs_task.delay(2, b=3, c=4, d=6) != first


def test__unique_on_is_string_convertes_to_list(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestUniqueOn::test__unique_on_is_string_convertes_to_list"""
    app = make_app()

    @app.task(shared=False, base=peer.Singleton, unique_on="c")
    def unique_on_string_task(a: int, b: int = 2, c: int = 3, d: int = 4) -> int:
        return a * b * c * d

    first = unique_on_string_task.delay(2, b=3, c=4, d=5)
    assert unique_on_string_task.delay(1, b=1, c=4, d=1) == first
    assert unique_on_string_task.delay(2, b=3, c=5, d=5) != first


def _duplicate_raises(task: Any, peer: SimpleNamespace) -> bool:
    task.delay()
    try:
        task.delay()
    except peer.DuplicateTaskError:
        return True
    return False


def test__raise_on_duplicate__default_false(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestRaiseOnDuplicateConfig::test__default_false"""
    app = make_app()

    @app.task(shared=False, base=peer.Singleton)
    def mytask() -> None:
        pass

    assert not _duplicate_raises(mytask, peer)


def test__task_cfg_overrides_app_cfg(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestRaiseOnDuplicateConfig::test__task_cfg_overrides_app_cfg"""
    app = make_app(singleton_raise_on_duplicate=False)

    @app.task(shared=False, base=peer.Singleton, raise_on_duplicate=True)
    def mytask() -> None:
        pass

    assert _duplicate_raises(mytask, peer)


def test__app_cfg_used_when_task_cfg_unset(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestRaiseOnDuplicateConfig::test__app_cfg_used_when_task_cfg_unset"""
    app = make_app(singleton_raise_on_duplicate=True)

    @app.task(shared=False, base=peer.Singleton)
    def mytask() -> None:
        pass

    assert _duplicate_raises(mytask, peer)


def test__lock_expiry(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_singleton.py::TestLockExpiry::test__lock_expiry__sent_to_backend
    (upstream mocks the backend's lock() and checks expiry=60): the key expires
    ``lock_expiry`` seconds after the publish."""
    simple_task = simple(make_app(), peer, lock_expiry=1)
    first = simple_task.delay(1, 2, 3)
    assert simple_task.delay(1, 2, 3) == first
    time.sleep(1.1)
    assert simple_task.delay(1, 2, 3) != first


def test__app_lock_expiry(make_app: Any, peer: SimpleNamespace) -> None:
    """tests/test_config.py::TestTaskExpiry::test__has_config_value, as
    behaviour: ``singleton_lock_expiry`` applies to a task without its own."""
    simple_task = simple(make_app(singleton_lock_expiry=1), peer)
    first = simple_task.delay(1)
    time.sleep(1.1)
    assert simple_task.delay(1) != first


@pytest.mark.parametrize(
    ("where", "conf"),
    [
        ("override", {"singleton_backend_url": "{base}/7"}),
        ("backend", {"singleton_backend_url": None, "result_backend": "{base}/7"}),
        (
            "broker",
            {
                "singleton_backend_url": None,
                "result_backend": "cache+memory://",
                "broker_url": "{base}/7",
            },
        ),
    ],
)
def test__backend_url(
    make_app: Any, peer: SimpleNamespace, redis_base: str, where: str, conf: dict[str, Any]
) -> None:
    """tests/test_config.py::TestBackendUrl (test__override_url,
    test__defaults_to_celery_backend_url, test__defaults_to_celery_broker_url)
    as behaviour: the keys live in ``singleton_backend_url``, else the result
    backend's Redis, else the broker's (db 7 here)."""
    db7 = redis.Redis.from_url(f"{redis_base}/7")
    db7.flushdb()
    app = make_app(**{k: v.format(base=redis_base) if v else v for k, v in conf.items()})
    if where == "broker":
        app.conf.task_ignore_result = True
    simple_task = simple(app, peer)
    with mock.patch.object(BaseTask, "apply_async"):  # (nothing sent: db 7 holds only the key)
        simple_task.delay(1)
    assert db7.dbsize() == 1
    db7.flushdb()
