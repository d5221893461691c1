"""A LockedTask's release, folded into the transaction that stores its result (fold.py).

Celery's own tracer runs each task here, in this process (``build_tracer``,
as a worker's pool child does), against a real redis-server: the result
backend and the lock store on one server.  What must hold: the release goes
in the store's MULTI ... EXEC (no round trip of its own, counted on the
sockets); it happens exactly once, whatever goes wrong with the store; and
runs the fold must not touch release as the body ends, as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, Optional

import pytest
import redis
from celery import Celery
from celery.app.task import Context
from celery.app.trace import build_tracer

from celery_redislock import Lock, LockedTask, checkout, config, fold, keys, renewal, signals
from celery_redislock.task import Hold
from tests.helpers import counted
from tests.redis_server import RedisServer

FLUSH = "flush scripts"
EARLIER = "an earlier delivery succeeded"


def make_app(
    base: str, result_base: Optional[str] = None, *, result_db: int = 2, **conf: Any
) -> Any:
    app = Celery(f"fold-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(
        broker_url=f"{base}/1",
        result_backend=f"{result_base or base}/{result_db}",
        redislock_url=f"{base}/0",
        **conf,
    )

    @app.task(base=LockedTask, lock_key=["n"], name="fold.work", shared=False, on_contention="fail")
    def work(n: int, action: Optional[str] = None) -> Any:
        if action == FLUSH:
            redis.Redis.from_url(f"{base}/0").script_flush()
        elif action == EARLIER:
            app.backend.store_result(work.request.id, "earlier", "SUCCESS")
        elif action == "unencodable":
            return object()
        return n

    app.finalize()
    return app, work


def run(task: Any, n: int, action: Optional[str] = None, **request: Any) -> str:
    """Run one message of ``task`` through Celery's tracer, as a pool child does."""
    task_id = str(uuid.uuid4())
    tracer = build_tracer(task.name, task, app=task.app, eager=False, hostname="fold@test")
    kwargs = {"action": action} if action else {}
    message = {"id": task_id, "hostname": "fold@test", "delivery_info": {}, **request}
    tracer(task_id, (n,), kwargs, message)
    return task_id


def lock_key(task: Any, n: int) -> str:
    name = task.lock_name_for((n,), {})
    return keys.lock_keys(config.settings_for(task.app).key_prefix, name).lock


class Sockets:
    """This thread's hot-path sockets to the lock store and to the result store, counted."""

    def __init__(self, task: Any) -> None:
        _, self.lock = counted(config.client_for(task.app))
        _, self.store = counted(task.app.backend.client)


@pytest.fixture
def signalled() -> Iterator[dict[str, list[Any]]]:
    got: dict[str, list[Any]] = {"released": [], "lost": []}

    def released(**kw: Any) -> None:
        got["released"].append(kw["fence"])

    def lost(**kw: Any) -> None:
        got["lost"].append(kw["reason"])

    signals.lock_released.connect(released, weak=False)
    signals.lock_lost.connect(lost, weak=False)
    yield got
    signals.lock_released.disconnect(released)
    signals.lock_lost.disconnect(lost)
    assert renewal.keeper().held() == [], "a hold is still renewed"


def stored(task: Any, task_id: str) -> dict[str, Any]:
    raw = task.app.backend.client.get(task.app.backend.get_key_for_task(task_id))
    assert raw is not None, f"no result stored for {task_id}"
    return task.app.backend.decode_result(raw)  # type: ignore[no-any-return]


def lock_store(base: str) -> redis.Redis:
    return redis.Redis.from_url(f"{base}/0")


@pytest.fixture
def base(redis_url: str) -> str:
    return redis_url.rsplit("/", 1)[0]


@pytest.mark.parametrize("result_db", [0, 2])
def test_the_release_goes_in_the_transaction_that_stores_the_result(
    base: str, signalled: dict[str, list[Any]], result_db: int
) -> None:
    app, work = make_app(base, result_db=result_db)
    run(work, 0)  # connections open, scripts loaded
    sockets = Sockets(work)
    signalled["released"].clear()
    task_id = run(work, 1)
    assert (sockets.lock.sends, sockets.lock.recvs) == (1, 1)  # the acquire, nothing else
    # MULTI [SELECT] EVALSHA lock_release [SELECT] EVALSHA result_store EXEC
    assert sockets.store.sends == 1
    sent = sockets.store.sent[0]
    assert sent.startswith(b"*1\r\n$5\r\nMULTI\r\n") and sent.endswith(b"$4\r\nEXEC\r\n")
    assert sent.count(b"EVALSHA") == 2 and sent.count(b"SELECT") == (2 if result_db else 0)
    assert stored(work, task_id)["status"] == "SUCCESS" and stored(work, task_id)["result"] == 1
    assert not lock_store(base).exists(lock_key(work, 1))
    assert len(signalled["released"]) == 1 and signalled["lost"] == []
    # The store's connection is back on the result db: the next result lands there.
    other = run(work, 2)
    assert redis.Redis.from_url(f"{base}/{result_db}").exists(app.backend.get_key_for_task(other))
    if result_db != 0:
        assert not lock_store(base).exists(app.backend.get_key_for_task(other))


@pytest.mark.parametrize("case", ["ignore_result", "callbacks", "turned off", "other server"])
def test_runs_that_cannot_fold_release_as_the_body_ends(
    base: str, signalled: dict[str, list[Any]], case: str
) -> None:
    request: dict[str, Any] = {}
    conf: dict[str, Any] = {}
    other: Optional[RedisServer] = None
    result_base = None
    if case == "ignore_result":
        request["ignore_result"] = True
    elif case == "callbacks":
        request["callbacks"] = [{"task": "fold.nothing", "args": [], "kwargs": {}, "options": {}}]
    elif case == "turned off":
        conf["redislock_release_with_result"] = False
    else:
        other = RedisServer().start()
        result_base = other.url.rsplit("/", 1)[0]
    try:
        _, work = make_app(base, result_base, **conf)
        run(work, 0)
        sockets = Sockets(work)
        signalled["released"].clear()
        run(work, 1, **request)
        # The acquire, then the release as the body ended (its reply read at after_return).
        assert (sockets.lock.sends, sockets.lock.recvs) == (2, 2)
        assert sockets.store.sends == 0
        assert not lock_store(base).exists(lock_key(work, 1))
        assert len(signalled["released"]) == 1 and signalled["lost"] == []
    finally:
        if other is not None:
            other.stop()
        redis.Redis.from_url(f"{base}/1").flushdb()  # the callback's message


def test_a_broken_store_connection_releases_once_and_celery_stores_the_result(
    base: str, signalled: dict[str, list[Any]]
) -> None:
    _, work = make_app(base)
    run(work, 0)
    held = checkout.checkout(work.app.backend.client.connection_pool)
    assert held is not None
    held.conn._sock.close()  # the transaction cannot be sent
    signalled["released"].clear()
    task_id = run(work, 1)
    assert stored(work, task_id)["result"] == 1  # by Celery's own set, on a fresh connection
    assert not lock_store(base).exists(lock_key(work, 1))
    assert len(signalled["released"]) == 1 and signalled["lost"] == []
    run(work, 2)  # and the fold works again afterwards
    assert len(signalled["released"]) == 2


def test_a_script_flushed_before_the_store_is_loaded_and_released(
    base: str, signalled: dict[str, list[Any]]
) -> None:
    _, work = make_app(base)
    run(work, 0)
    signalled["released"].clear()
    task_id = run(work, 1, FLUSH)  # the body flushes the scripts: EXEC says NOSCRIPT
    assert stored(work, task_id)["status"] == "SUCCESS"
    assert not lock_store(base).exists(lock_key(work, 1))
    assert len(signalled["released"]) == 1 and signalled["lost"] == []


def test_a_result_that_cannot_be_encoded_fails_and_still_releases_once(
    base: str, signalled: dict[str, list[Any]]
) -> None:
    _, work = make_app(base)
    run(work, 0)
    sockets = Sockets(work)
    signalled["released"].clear()
    task_id = run(work, 1, "unencodable")
    meta = stored(work, task_id)
    assert meta["status"] == "FAILURE" and type(meta["result"]).__name__ == "EncodeError"
    assert sockets.lock.sends == 1  # folded into the FAILURE's store instead
    assert not lock_store(base).exists(lock_key(work, 1))
    assert len(signalled["released"]) == 1 and signalled["lost"] == []


def test_an_earlier_success_is_kept_and_the_release_still_folds(
    base: str, signalled: dict[str, list[Any]]
) -> None:
    """A redelivered run whose first delivery already succeeded: the SUCCESS
    is kept (Celery checks with a read first; here the store script does),
    and the release still goes in the same transaction."""
    _, work = make_app(base)
    run(work, 0)
    sockets = Sockets(work)
    signalled["released"].clear()
    task_id = run(work, 1, EARLIER)
    assert stored(work, task_id)["result"] == "earlier"  # untouched
    assert (sockets.lock.sends, sockets.store.sends) == (1, 1)
    assert not lock_store(base).exists(lock_key(work, 1))
    assert len(signalled["released"]) == 1 and signalled["lost"] == []


def test_a_release_whose_store_never_comes_happens_at_process_cleanup(
    base: str, signalled: dict[str, list[Any]]
) -> None:
    """The tracer calls process_cleanup last for every run; a release still
    waiting for its store there (an internal error skipped both the store
    and after_return) is made then."""
    app, work = make_app(base)
    run(work, 0)  # the backend now folds
    lock = Lock(config.client_for(app), "fold-cleanup", ttl=5.0)
    assert lock.acquire()
    request = Context(id=str(uuid.uuid4()), hostname="fold@test", delivery_info={})
    signalled["released"].clear()
    assert fold.offer(work, request, Hold(work, request, lock))
    assert lock_store(base).exists(lock.key)
    app.backend.process_cleanup()
    assert not lock_store(base).exists(lock.key)
    assert len(signalled["released"]) == 1 and signalled["lost"] == []


def test_celery_s_read_of_the_result_is_not_sent(base: str) -> None:
    """Celery reads a result before storing it (to keep an earlier SUCCESS);
    folded, that check runs inside the store script: one round trip fewer."""
    _, work = make_app(base)
    run(work, 0)
    admin = redis.Redis.from_url(f"{base}/0")
    with admin.monitor() as monitor:
        task_id = run(work, 1)
        admin.ping()  # the last command seen: everything before it was the run's
        seen = []
        while True:
            command = monitor.next_command()
            if command["command"] == "PING":
                break
            seen.append((command["client_type"], command["command"].split()[0]))
    assert stored(work, task_id)["result"] == 1
    outside = [n for kind, n in seen if kind != "lua" and n not in ("HELLO", "CLIENT")]
    assert outside == ["EVALSHA", "MULTI", "SELECT", "EVALSHA", "SELECT", "EVALSHA", "EXEC"], seen
