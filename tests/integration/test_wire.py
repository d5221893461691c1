"""The hand-packed hot path (wire.py) against a real redis-server.

What it must keep from redis-py's own path: the exact command on the wire,
NOSCRIPT recovery, reconnecting after a dropped connection, and falling back
to redis-py for clients it does not drive itself.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import redis

from celery_redislock import Lock, Semaphore, checkout, resp, scripts, wire
from tests.helpers import blocked_clients, counting_client, sha, wait_until


def test_packed_evalsha_is_the_command_redis_py_would_send(redis_url: str) -> None:
    client, trips = counting_client(redis_url)
    block = wire.KeyBlock(["k:{a}", "ü:{a}"])
    client.script_load(scripts.get("multi_count").script)  # connected, script loaded
    trips.reset()
    reply = wire.evalsha(
        client, scripts.get("multi_count"), wire.KeyBlock(["k:{a}"]), ["x", 7, 2.5, b"\x00\xff"]
    )
    assert reply == 0
    assert trips.sends == [
        [(b"EVALSHA", sha("multi_count"), b"1", b"k:{a}", b"x", b"7", b"2.5", b"\x00\xff")]
    ]
    assert block.packed == b"$1\r\n2\r\n$5\r\nk:{a}\r\n$6\r\n\xc3\xbc:{a}\r\n"
    with pytest.raises(TypeError, match="cannot send"):
        wire.evalsha(client, scripts.get("multi_count"), block, [None])


def test_a_flushed_script_is_loaded_again_and_the_call_goes_through(
    redis_url: str, r: redis.Redis
) -> None:
    client, trips = counting_client(redis_url)
    lock = Lock(client, "wire-flushed", ttl=5.0)
    lock.acquire()
    lock.release()
    client.ping()  # the pool's other connection (SCRIPT LOAD goes through redis-py) is open
    r.script_flush()
    trips.reset()
    assert lock.acquire()
    # The EVALSHA answered NOSCRIPT; SCRIPT LOAD, then the same EVALSHA again.
    assert trips.names() == [["EVALSHA"], ["SCRIPT"], ["EVALSHA"]]
    assert trips.sends[0] == trips.sends[2]
    lock.release()
    assert not r.exists(lock.key)


def test_a_connection_dropped_by_the_server_is_reopened(redis_url: str, r: redis.Redis) -> None:
    client = redis.Redis.from_url(redis_url)
    lock = Lock(client, "wire-dropped", ttl=5.0)
    lock.acquire()
    lock.release()
    killed = r.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    assert lock.acquire()  # the client's retry policy reconnects and sends again
    assert r.get(lock.key) == lock.token.encode()  # type: ignore[union-attr]
    lock.release()


@pytest.mark.parametrize(
    "options",
    [
        {"single_connection_client": True},
        {"decode_responses": True},
        {"encoding": "latin-1"},
        {"pool_class": redis.BlockingConnectionPool},
    ],
    ids=["single-connection", "decode-responses", "latin-1", "blocking-pool-of-1"],
)
def test_handoff_works_with_any_client_configuration(
    redis_url: str, r: redis.Redis, options: dict[str, Any]
) -> None:
    def client() -> redis.Redis:
        if "pool_class" in options:
            pool = options["pool_class"].from_url(redis_url, max_connections=1)
            return redis.Redis(connection_pool=pool)
        return redis.Redis.from_url(redis_url, **options)

    holder_client, waiter_client = client(), client()
    holder = Semaphore(holder_client, "wire-any-client", 1, ttl=5.0)
    waiter = Semaphore(waiter_client, "wire-any-client", 1, ttl=5.0)
    assert holder.acquire()
    fence = holder.fence
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=5)))
    thread.start()
    wait_until(lambda: blocked_clients(r) == 1, 3, what="the waiter to block")
    holder.release()
    thread.join(5)
    assert got == [True]
    assert waiter.fence == fence + 1  # type: ignore[operator]
    waiter.release()
    assert waiter_client.zcard(waiter.key) == 0


def test_a_thread_gives_its_connection_back_when_it_ends(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    pool = client.connection_pool

    def use() -> None:
        with Lock(client, "wire-thread", ttl=5.0):
            assert len(pool._in_use_connections) == 1  # kept by this thread

    thread = threading.Thread(target=use)
    thread.start()
    thread.join(5)
    assert len(pool._in_use_connections) == 0
    assert len(pool._available_connections) == 1


class Interrupted(BaseException):
    """Stands in for an exception raised between send and read (a soft time limit)."""


def test_a_reply_left_unread_is_never_taken_for_the_next_one(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_url)
    first = Lock(client, "wire-unread-1", ttl=5.0)
    second = Lock(client, "wire-unread-2", ttl=5.0)
    first.acquire()  # this thread's connection is open, the script loaded
    first.release()
    real = resp.read_reply

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(resp, "read_reply", real)
        raise Interrupted()

    monkeypatch.setattr(resp, "read_reply", interrupted)
    with pytest.raises(Interrupted):
        first.acquire()  # sent: the script ran and granted fence 2, unread
    assert second.acquire()
    assert second.fence == 1  # its own reply, not the first lock's fence 2
    second.release()


def test_pools_of_redis_py_before_5_3_are_asked_with_a_command_name() -> None:
    class OldPool:
        def get_connection(self, command_name: str, *keys: Any, **options: Any) -> Any:
            return ("old", command_name)

    class NewPool:
        def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
            return ("new", command_name)

    assert checkout.borrow(OldPool()) == ("old", "EVALSHA")
    assert checkout.borrow(NewPool()) == ("new", None)


def test_a_forked_child_opens_its_own_client_and_connection(redis_url: str) -> None:
    from celery import Celery

    from celery_redislock import config

    app = Celery("fork-test", set_as_current=False)
    app.conf.redislock_url = redis_url
    parent_client = config.client_for(app)
    lock = Lock(parent_client, "wire-fork", ttl=5.0)
    with lock:  # the parent's hot-path connection is open
        pass
    held = checkout.checkout(parent_client.connection_pool)
    assert held is not None
    parent_conn = held.conn
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            child_held = checkout.checkout(parent_client.connection_pool)
            child_lock = Lock(parent_client, "wire-fork", ttl=5.0)
            ok = (
                config.client_for(app) is not parent_client
                and child_held is not None
                and child_held.conn is not parent_conn
                and child_lock.acquire(blocking=False)
            )
            child_lock.release()
            os.write(write_end, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read_end, 1) == b"1"
    assert config.client_for(app) is parent_client
    assert checkout.checkout(parent_client.connection_pool) is held
    with lock:  # the parent's connection was not disturbed
        assert lock.fence == 3
