"""The hand-packed hot path (wire.py) against a real redis-server.

What it must keep from redis-py's own path: the exact command on the wire,
NOSCRIPT recovery, reconnecting after a dropped connection, and falling back
to redis-py for clients it does not drive itself.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from celery_redislock import Lock, Semaphore, scripts, wire
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
    [{"single_connection_client": True}, {"decode_responses": True}, {"encoding": "latin-1"}],
    ids=["single-connection", "decode-responses", "latin-1"],
)
def test_handoff_works_with_any_client_configuration(
    redis_url: str, r: redis.Redis, options: dict[str, Any]
) -> None:
    holder_client = redis.Redis.from_url(redis_url, **options)
    waiter_client = redis.Redis.from_url(redis_url, **options)
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
