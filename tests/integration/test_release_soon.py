"""Releases whose reply is read later (Primitive.release_soon, checkout.py).

LockedTask sends its release when the body ends and reads the reply once
the result is stored.  What must hold: the lock is free as soon as Redis
reads the release, still one round trip; the reply is read before anything
else this thread sends on that connection (never taken for another
command's); every outcome reaches the callback, including a connection that
broke first; a thread never hands on a connection with a reply unread.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import redis

from celery_redislock import Lock, LockLost, checkout, wire
from tests.helpers import counted, counting_client, wait_until


def held_lock(redis_url: str, name: str) -> tuple[redis.Redis, Lock]:
    """A held Lock on a fresh client whose connection is open and scripts loaded."""
    client = redis.Redis.from_url(redis_url)
    lock = Lock(client, name, ttl=5.0)
    with lock:
        pass
    assert lock.acquire()
    return client, lock


def outcomes() -> tuple[list[Optional[Exception]], Any]:
    got: list[Optional[Exception]] = []
    return got, got.append


def test_the_lock_is_free_before_the_reply_is_read(r: redis.Redis, redis_url: str) -> None:
    client, lock = held_lock(redis_url, "soon-free")
    held, sock = counted(client)
    got, done = outcomes()
    lock.release_soon(done)
    assert (sock.sends, sock.recvs, got) == (1, 0, [])  # sent, not read
    assert lock.token is None and lock.fence is None
    wait_until(lambda: not r.exists(lock.key), 2, what="the release to take effect")
    assert len(held.pending) == 1
    wire.settle(client)
    assert (sock.sends, sock.recvs, got) == (1, 1, [None])  # one round trip in all
    assert not held.pending
    wire.settle(client)  # nothing left: no I/O
    assert (sock.sends, sock.recvs) == (1, 1)


def test_a_deferred_reply_is_read_before_the_next_command(r: redis.Redis, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    first, second = Lock(client, "soon-a", ttl=5.0), Lock(client, "soon-b", ttl=5.0)
    for _ in range(3):  # fences 1..3 of "soon-a"
        assert first.acquire()
        first.release()
    assert first.acquire()
    order: list[str] = []
    first.release_soon(lambda exc: order.append(f"released {exc}"))
    assert second.acquire()
    order.append("acquired")
    assert order == ["released None", "acquired"]
    assert second.fence == 1  # its own reply, not the release's
    second.release_soon(lambda exc: order.append(f"released {exc}"))
    assert first.acquire()  # the pending reply is read first, again
    assert first.fence == 5
    assert order[-1] == "released None"
    first.release()
    assert not r.exists(first.key) and not r.exists(second.key)


def test_a_lease_that_ran_out_is_reported_as_lost(r: redis.Redis, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    lock = Lock(client, "soon-lost", ttl=0.2, renew=False)
    assert lock.acquire()
    time.sleep(0.35)
    other = Lock(client, "soon-lost", ttl=5.0)
    assert other.acquire()
    got, done = outcomes()
    lock.release_soon(done)
    wire.settle(client)
    assert len(got) == 1 and isinstance(got[0], LockLost)
    assert lock.lost
    assert r.get(other.key) == other.token.encode()  # type: ignore[union-attr]  # untouched
    other.release()


def test_a_release_that_never_ran_is_sent_again(r: redis.Redis, redis_url: str) -> None:
    """The connection breaks after the release was sent but before Redis ran it
    (here: Redis is paused for writes, and the connection is killed meanwhile).
    Reading the reply fails; the release goes out again on a fresh connection."""
    client, lock = held_lock(redis_url, "soon-unsent")
    # The id of this thread's hot-path connection, asked on that connection.
    own_id = wire._roundtrip(client.connection_pool, b"*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n")
    held = checkout.checkout(client.connection_pool)
    assert held is not None
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("CLIENT", "PAUSE", 300, "WRITE")
    got, done = outcomes()
    lock.release_soon(done)  # queued behind the pause
    wait_until(
        lambda: any(c["id"] == str(own_id) and c["cmd"] == "evalsha" for c in admin.client_list()),
        2,
        what="the release to reach Redis",
    )
    assert r.exists(lock.key)  # not run yet
    assert admin.client_kill_filter(_id=own_id) == 1
    wire.settle(client)
    assert got == [None]  # released by the second send, after the pause
    assert not r.exists(lock.key)
    assert held.conn._sock is not None  # the fresh connection, kept for next time


def test_a_reply_lost_after_the_release_ran_is_reported_as_lost(
    r: redis.Redis, redis_url: str
) -> None:
    """Whether a command whose reply was lost ran cannot be known: the release is
    sent again, finds the lock gone (it had run), and says the lock was lost,
    as release() does after a connection breaks mid-call."""
    client, lock = held_lock(redis_url, "soon-broken")
    held = checkout.checkout(client.connection_pool)
    assert held is not None
    got, done = outcomes()
    lock.release_soon(done)
    wait_until(lambda: not r.exists(lock.key), 2, what="the release to take effect")
    held.conn._sock.close()  # the reply can no longer be read
    wire.settle(client)
    assert len(got) == 1 and isinstance(got[0], LockLost)
    assert not r.exists(lock.key)  # nothing else was touched
    assert lock.acquire()
    lock.release()


def test_a_flushed_script_is_loaded_again(r: redis.Redis, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    lock = Lock(client, "soon-flushed", ttl=5.0)
    assert lock.acquire()
    client.ping()  # the pool's other connection (SCRIPT LOAD goes through redis-py) is open
    r.script_flush()
    got, done = outcomes()
    lock.release_soon(done)
    wire.settle(client)
    assert got == [None]
    assert not r.exists(lock.key)


def test_clients_the_hot_path_does_not_drive_release_at_once(redis_url: str) -> None:
    client, trips = counting_client(redis_url)  # a Connection subclass: redis-py's path
    lock = Lock(client, "soon-fallback", ttl=5.0)
    assert lock.acquire()
    trips.reset()
    got, done = outcomes()
    lock.release_soon(done)
    assert got == [None]  # read at once
    assert trips.names() == [["EVALSHA"]]


def test_a_thread_never_hands_on_a_connection_with_a_reply_unread(
    r: redis.Redis, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    pool = client.connection_pool
    got, done = outcomes()

    def use() -> None:
        lock = Lock(client, "soon-thread", ttl=5.0)
        assert lock.acquire()
        lock.release_soon(done)  # and the thread ends without reading the reply

    thread = threading.Thread(target=use)
    thread.start()
    thread.join(5)
    wait_until(lambda: not pool._in_use_connections, 2, what="the connection to be given back")
    (conn,) = pool._available_connections
    assert conn._sock is None  # closed: its unread reply went with it
    assert got == []
    assert client.ping()
    assert not r.exists("redislock:{soon-thread}:lock")


def test_settle_without_a_client_reads_every_deferred_reply_of_the_thread(
    r: redis.Redis, redis_url: str
) -> None:
    (_, first), (_, second) = held_lock(redis_url, "soon-x"), held_lock(redis_url, "soon-y")
    got, done = outcomes()
    first.release_soon(done)
    second.release_soon(done)
    assert got == []
    wire.settle()  # what LockedTask.after_return does
    assert got == [None, None]
    for _ in range(50):  # replies read by the next command leave no trace behind
        assert first.acquire()
        first.release_soon(done)
    assert first.acquire()
    first.release()
    assert len(checkout._local.unsettled) <= 2
    wire.settle()
    assert got == [None] * 52 and not checkout._local.unsettled
