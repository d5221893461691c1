"""The transport against real redis-servers: every call goes through the user's redis-py client.

What the client was configured with applies to lock commands too (its
encoding, decode_responses, RESP3, health checks, TLS, unix sockets, a
bounded pool, a single connection), error replies raise what redis-py
raises (and "cannot reach" becomes BackendUnavailable), and a command whose
reply was never read is never mistaken for the next one's.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import (
    BackendUnavailable,
    BackendUnsupported,
    Lock,
    LockLost,
    ReadWriteLock,
    Semaphore,
    transport,
)
from celery_redislock.primitives import _keeper, scripts
from celery_redislock.transport import _checkout, _own
from celery_redislock.transport._encode import KeyBlock
from celery_redislock.transport._errors import translated
from celery_redislock.transport._waits import MARGIN
from tests.helpers import (
    Attempt,
    TcpProxy,
    blocked_clients,
    collect_earlier_garbage,
    counting_client,
    forking,
    wait_until,
)
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.usefixtures("no_leaked_leases")

ROOT = Path(__file__).resolve().parents[2]


def no_retry(**options: Any) -> dict[str, Any]:
    """Client options that fail at once rather than after redis-py's default backoff."""
    return {"retry": Retry(NoBackoff(), 0), "socket_connect_timeout": 2, **options}


# -- what goes on the wire -----------------------------------------------------------


def test_a_call_goes_out_as_redis_pys_evalsha_in_the_clients_encoding() -> None:
    keys = ["redislock:{ünï}:lock", "k2"]
    block = KeyBlock(keys, "latin-1")  # the keys encoded once, as the client would
    args: list[Any] = ["tók", 30000, 0, "w:", 2000, 1.5, b"\x00\xff"]
    sha = scripts.get("lock_acquire").sha
    packer = redis.Connection(encoding="latin-1")
    ours = b"".join(packer.pack_command(*block.evalsha(sha, args)))
    theirs = b"".join(packer.pack_command("EVALSHA", sha, 2, *keys, *args))
    assert ours == theirs
    assert "ünï".encode("latin-1") in ours and "tók".encode("latin-1") in ours


def test_a_release_packed_ahead_still_carries_a_reservation_set_after_acquire(
    redis_url: str,
) -> None:
    client, trips = counting_client(redis_url)
    lock = Lock(client, "transport-prepared", ttl=5.0, renew=False)
    assert lock.acquire()
    lock.release()  # (scripts loaded, a connection made)
    for reserve_ms in (None, 1234):
        assert lock.acquire()
        token = lock.token
        if reserve_ms is not None:
            lock.reserve_ms = reserve_ms
        trips.reset()
        lock.release()
        ((command,),) = trips.sends
        argv = command[3 + int(command[2]) :]
        assert command[0] == b"EVALSHA" and argv[0] == token.encode()  # type: ignore[union-attr]
        assert argv[3:] == (() if reserve_ms is None else (b"0", b"1234"))
    client.close()


def test_a_flushed_script_is_loaded_again_and_the_call_goes_through(r: redis.Redis) -> None:
    lock = Lock(r, "transport-noscript", ttl=5.0)
    assert lock.acquire()
    r.script_flush()
    lock.release()  # NOSCRIPT: loaded and sent again
    assert lock.acquire()
    r.script_flush()
    pending = lock.release_async()
    pending.wait()  # the same from a release whose reply is read later
    assert not r.exists(lock.key)


def test_a_flushed_batch_loads_each_script_once_and_resends_only_its_calls(
    redis_url: str, r: redis.Redis
) -> None:
    client, trips = counting_client(redis_url)
    count, fence = scripts.get("multi_count"), scripts.get("fence_bump")
    calls = [(count, KeyBlock([f"transport-batch-{i}"]), []) for i in range(3)]
    r.script_load(fence.script)
    calls.append((fence, KeyBlock(["transport-batch-fence"]), [1000]))
    assert transport.call_batch(client, calls)[:3] == [0, 0, 0]
    r.script_flush()
    r.script_load(fence.script)  # known: its call is not sent again
    trips.reset()
    assert transport.call_batch(client, calls)[:3] == [0, 0, 0]
    assert trips.names(handshake=False) == [
        ["EVALSHA"] * 4,  # the pipeline: three answered NOSCRIPT
        ["SCRIPT"],  # their script loaded, once
        ["EVALSHA"] * 3,  # and just those three sent again
    ]
    client.close()


def test_a_connection_killed_by_the_server_is_reopened(r: redis.Redis, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    lock = Lock(client, "transport-killed", ttl=5.0)
    assert lock.acquire()
    lock.release()
    assert r.client_kill_filter(_type="normal", skipme=True) >= 1
    assert lock.acquire()  # the client's retry policy reconnects and sends again
    assert r.get(lock.key) == lock.token.encode()  # type: ignore[union-attr]
    lock.release()


# -- taking a connection from the pool -----------------------------------------------------


class CheckoutCount:
    """Counts a pool's get_connection() calls."""

    def __init__(self, pool: Any) -> None:
        self.calls = 0
        taken = pool.get_connection

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return taken(*args, **kwargs)

        pool.get_connection = counted


def readable(conn: Any) -> bool:
    return bool(select.select([conn._sock], [], [], 0)[0])


def test_this_redis_py_pool_checkout_is_one_the_library_mirrors() -> None:
    # Every redis-py the library declares and CI installs (5.0 to 8.1) has one;
    # a later one whose checkout takes other steps is left to get_connection().
    if tuple(int(p) for p in redis.__version__.split(".")[:2]) <= (8, 1):
        assert _checkout.mirrored()


@pytest.mark.parametrize(
    "pool_class",
    [redis.ConnectionPool, redis.BlockingConnectionPool, type("Sub", (redis.ConnectionPool,), {})],
)
def test_only_a_plain_pools_idle_connection_skips_get_connection(
    redis_url: str, pool_class: Any
) -> None:
    pool = pool_class.from_url(redis_url)
    client = redis.Redis(connection_pool=pool)
    lock = Lock(client, f"transport-checkout-{pool_class.__name__}", ttl=5.0, renew=False)
    assert lock.acquire()
    lock.release()
    count = CheckoutCount(pool)
    for _ in range(3):
        assert lock.acquire()
        lock.release()
    mirrored = pool_class is redis.ConnectionPool and _checkout.mirrored()
    assert count.calls == (0 if mirrored else 6)
    if pool_class is not redis.BlockingConnectionPool:
        assert len(pool._in_use_connections) == 0 and len(pool._available_connections) == 1
    client.close()


def test_a_pooled_connection_the_server_closed_is_reopened_before_the_send(
    r: redis.Redis, redis_url: str
) -> None:
    # No retries: a send on the closed connection would fail the call.
    client = redis.Redis.from_url(redis_url, **no_retry())
    lock = Lock(client, "transport-checkout-closed", ttl=5.0, renew=False)
    for _ in range(3):
        assert lock.acquire()
        lock.release()  # the pool's one connection is idle again
        assert r.client_kill_filter(_id=client.client_id()) == 1
        (idle,) = client.connection_pool._available_connections
        wait_until(lambda idle=idle: readable(idle), 2, what="the server to close it")
    assert lock.acquire() and r.get(lock.key) == lock.token.encode()  # type: ignore[union-attr]
    lock.release()
    client.close()


def test_a_pooled_connection_with_a_reply_unread_is_not_read_from(redis_url: str) -> None:
    # Where redis-py's pool checks for one: since redis-py 7 it does not while
    # maintenance notifications are on (their default, "auto"), and neither
    # does the library then.
    options: dict[str, Any] = {}
    with contextlib.suppress(ImportError):
        from redis.maint_notifications import MaintNotificationsConfig

        options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    client = redis.Redis.from_url(redis_url, **options)
    pool = client.connection_pool
    lock = Lock(client, "transport-checkout-unread", ttl=5.0, renew=False)
    assert lock.acquire()
    lock.release()
    try:
        conn = pool.get_connection()
    except TypeError:  # redis-py before 5.3 wants a command name
        conn = pool.get_connection("ECHO")
    conn.send_command("ECHO", "stale")  # its reply never read
    wait_until(lambda: readable(conn), 2, what="the reply")
    pool.release(conn)
    assert lock.acquire() and isinstance(lock.fence, int)
    lock.release()
    client.close()


def test_a_mirrored_checkout_keeps_the_pools_connection_counts(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    import redis.connection

    if not hasattr(redis.connection, "record_connection_count"):
        pytest.skip("this redis-py records no connection counts")
    from redis.observability.attributes import get_pool_name

    with redis.Redis.from_url(redis_url) as warm:  # the scripts loaded: no NOSCRIPT below
        warm_lock = Lock(warm, "transport-checkout-counts", ttl=5.0, renew=False)
        assert warm_lock.acquire()
        warm_lock.release()
    changes: Counter[str] = Counter()
    updates: list[str] = []
    client = redis.Redis.from_url(redis_url)
    ours = get_pool_name(client.connection_pool)

    def record(pool_name: str, connection_state: Any, counter: int = 1) -> None:
        if pool_name != ours:  # (another pool, closed as it is collected)
            return
        changes[connection_state.name] += counter
        updates.append(connection_state.name)

    monkeypatch.setattr(redis.connection, "record_connection_count", record)
    lock = Lock(client, "transport-checkout-counts", ttl=5.0, renew=False)
    for _ in range(3):
        assert lock.acquire()
        lock.release()
    # One connection, made once (IDLE +1), then each of the 6 calls as the pool
    # counts a checkout and a checkin: IDLE -1, USED +1, then USED -1, IDLE +1.
    assert changes == {"IDLE": 1, "USED": 0}
    assert updates.count("USED") == 12
    client.close()


def test_a_forked_child_never_sends_on_its_parents_pooled_connection(r: redis.Redis) -> None:
    lock = Lock(r, "transport-checkout-fork", ttl=5.0, renew=False)
    assert lock.acquire()
    lock.release()
    read, write = os.pipe()
    with forking():
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = False
        with contextlib.suppress(BaseException):
            made_here: list[bool] = []
            send = redis.Connection.send_packed_command

            def noted(conn: Any, *args: Any, **kwargs: Any) -> Any:
                made_here.append(conn.pid == os.getpid())
                return send(conn, *args, **kwargs)

            redis.Connection.send_packed_command = noted  # type: ignore[method-assign]
            # (The parent's lock: nothing of the client is touched before the call.)
            ok = lock.acquire()
            lock.release()
            ok = ok and bool(made_here) and all(made_here)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        assert answer.read() == b"1"
    os.waitpid(pid, 0)
    assert lock.acquire()  # the parent's connection is still in step
    lock.release()


# -- any client configuration ------------------------------------------------------------


CONFIGURATIONS = {
    "single-connection": {"single_connection_client": True},
    "decode-responses": {"decode_responses": True},
    "latin-1": {"encoding": "latin-1"},
    "resp2": {"protocol": 2},
    "resp3": {"protocol": 3},
    "health-checks": {"health_check_interval": 1},
    "blocking-pool-of-1": {"pool_class": redis.BlockingConnectionPool, "max_connections": 1},
    "tls": {"tls": True},
    "unix-socket": {"unix": True},
}


def hand_over(holder: Any, waiter: Any, observer: redis.Redis) -> None:
    """``holder`` acquires, then releases to ``waiter`` blocked in acquire()."""
    assert holder.acquire()
    fence = holder.fence
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=5)))
    thread.start()
    wait_until(lambda: blocked_clients(observer) == 1, 3, what="the waiter to block")
    holder.release()
    thread.join(5)
    assert got == [True] and waiter.owned() and not holder.owned()
    assert waiter.fence > fence


@pytest.mark.parametrize("options", CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
def test_handoff_works_with_any_client_configuration(
    request: pytest.FixtureRequest, redis_url: str, options: dict[str, Any]
) -> None:
    options = dict(options)
    if options.pop("tls", False):
        server = request.getfixturevalue("tls_server")
        url = f"rediss://127.0.0.1:{server.port}/0"
        options["ssl_cert_reqs"] = "none"
    elif options.pop("unix", False):
        url = f"unix://{request.getfixturevalue('unix_server')}?db=0"
    else:
        url = redis_url

    def client() -> redis.Redis:
        pool_class = options.get("pool_class")
        if pool_class is not None:
            pool = pool_class.from_url(url, max_connections=options["max_connections"])
            return redis.Redis(connection_pool=pool)
        return redis.Redis.from_url(url, **options)

    holder_client, waiter_client, observer = client(), client(), client()
    name = f"transport-any-{request.node.callspec.id}"
    holder = Semaphore(holder_client, name, 1, ttl=5.0)
    waiter = Semaphore(waiter_client, name, 1, ttl=5.0)
    hand_over(holder, waiter, observer)
    waiter.release()
    assert observer.zcard(waiter.key) == 0
    lock = Lock(waiter_client, name, ttl=5.0)
    with lock:
        assert lock.owned() and lock.locked()


def test_a_client_side_caching_client_keeps_its_cache_and_hands_over(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, r: redis.Redis
) -> None:
    cache = pytest.importorskip("redis.cache", reason="client-side caching: redis-py >= 5.1")
    server = r.info("server")
    if server.get("server_name", "redis") != "redis":
        pytest.skip("redis-py caches only with Redis itself")
    if tuple(int(n) for n in server["redis_version"].split(".")[:2]) < (7, 4):
        # redis-py turns caching on from Redis 7.4 (a support policy); the
        # tracking and invalidation it relies on are RESP3's, there since 6.0.
        monkeypatch.setattr(redis.connection.CacheProxyConnection, "MIN_ALLOWED_VERSION", "6.0.0")
    holder_client, waiter_client = (
        redis.Redis.from_url(redis_url, protocol=3, cache_config=cache.CacheConfig())
        for _ in range(2)
    )
    r.set("cached", "1")
    assert holder_client.get("cached") == b"1"
    cached = holder_client.get_cache()
    assert cached is not None and cached.size == 1

    holder = Lock(holder_client, "transport-cached", ttl=5.0)
    waiter = Lock(waiter_client, "transport-cached", ttl=5.0)
    hand_over(holder, waiter, r)
    waiter.release()
    assert not r.exists(waiter.key)

    # The cache still answers, and is still invalidated by a write elsewhere.
    assert holder_client.get("cached") == b"1" and cached.size == 1
    r.set("cached", "2")
    wait_until(lambda: holder_client.get("cached") == b"2", 3, what="the invalidation")
    holder_client.close()
    waiter_client.close()


# -- error replies -------------------------------------------------------------------------


class ErrorServer:
    """A TCP server that answers every command with one error reply."""

    def __init__(self, error: bytes) -> None:
        self.error = error
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            while conn.recv(65536):
                conn.sendall(self.error + b"\r\n")

    def close(self) -> None:
        self.closed = True
        self.listener.close()


@contextlib.contextmanager
def answered_by(error: bytes) -> Iterator[redis.Redis]:
    """A RESP2 client, without retries, of an :class:`ErrorServer` answering ``error``."""
    server = ErrorServer(error)
    client = redis.Redis(port=server.port, protocol=2, **no_retry())
    try:
        yield client
    finally:
        client.close()
        server.close()


def assert_unavailable(client: redis.Redis, cause: type[BaseException]) -> None:
    lock = Lock(client, "transport-errors", ttl=5.0)
    with pytest.raises(BackendUnavailable) as caught:
        lock.acquire(blocking=False)
    assert isinstance(caught.value.__cause__, cause), repr(caught.value.__cause__)
    assert "transport-errors" in str(caught.value)


def test_a_server_still_loading_is_unavailable() -> None:
    with answered_by(b"-LOADING Redis is loading the dataset in memory") as client:
        assert_unavailable(client, redis.exceptions.BusyLoadingError)


def test_max_clients_is_unavailable() -> None:
    with answered_by(b"-ERR max number of clients reached") as client:
        assert_unavailable(client, redis.exceptions.ConnectionError)


@pytest.fixture(scope="module")
def password_server() -> Iterator[RedisServer]:
    server = RedisServer(extra=["--requirepass", "s3cret"])
    server.ping_options = {"password": "s3cret"}
    server.start()
    yield server
    server.stop()


def test_no_password_is_unavailable(password_server: RedisServer) -> None:
    client = redis.Redis(port=password_server.port, **no_retry())
    assert_unavailable(client, redis.exceptions.AuthenticationError)


def test_a_wrong_password_is_unavailable(password_server: RedisServer) -> None:
    client = redis.Redis(port=password_server.port, password="wrong", **no_retry())
    assert_unavailable(client, redis.exceptions.AuthenticationError)


def test_the_right_password_and_an_acl_user_work(password_server: RedisServer) -> None:
    admin = redis.Redis(port=password_server.port, password="s3cret")
    admin.acl_setuser(
        "locker", enabled=True, passwords=["+pw"], keys=["redislock:*"], commands=["+@all"]
    )
    for client in (admin, redis.Redis(port=password_server.port, username="locker", password="pw")):
        with Lock(client, "transport-auth", ttl=5.0) as lock:
            assert lock.owned()


def test_a_replica_answering_readonly_is_unavailable(r: redis.Redis, redis_url: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    replica = RedisServer(extra=["--replicaof", "127.0.0.1", str(port)]).start()
    try:
        client = redis.Redis(port=replica.port, **no_retry())
        assert_unavailable(client, redis.exceptions.ReadOnlyError)
    finally:
        replica.stop()


#: How Redis before 7.0 reports the refusal of a write that a script made: one
#: generic error, the inner error's code only in its text.
WRAPPED_READONLY = (
    b"-ERR Error running script (call to f_0123456789abcdef0123456789abcdef01234567): "
    b"@user_script:33: @user_script: 33: -READONLY You can't write against a read only replica."
)


def test_a_replica_refusing_a_scripts_write_is_unavailable_before_redis_7() -> None:
    with answered_by(WRAPPED_READONLY) as client:
        assert_unavailable(client, redis.exceptions.ReadOnlyError)
        # The same on the other two paths: a reply read later, and a batch.
        script = scripts.get("lock_release")
        block = KeyBlock(["transport-errors"], "utf-8")
        with pytest.raises(redis.exceptions.ReadOnlyError) as later:
            transport.call_soon(client, script, block, []).get()
        [batched] = transport.call_batch(client, [(script, block, [])])
        for error in (later.value, batched):
            assert isinstance(error, redis.exceptions.ReadOnlyError), repr(error)
            assert str(error) == "You can't write against a read only replica."
            assert isinstance(error.__cause__, redis.exceptions.ResponseError)


def test_script_errors_that_are_not_refusals_are_left_as_they_are() -> None:
    with answered_by(
        b"-ERR Error running script (call to f_0123456789abcdef0123456789abcdef01234567): "
        b"@user_script:3: @user_script: 3: -WRONGTYPE Operation against a key holding "
        b"the wrong kind of value"
    ) as client:
        lock = Lock(client, "transport-errors", ttl=5.0)
        with pytest.raises(redis.exceptions.ResponseError) as caught:
            lock.acquire(blocking=False)
        assert type(caught.value) is redis.exceptions.ResponseError
        assert "WRONGTYPE" in str(caught.value)


#: How a server before Redis 6.2 (this one is 5.0.6, word for word) refuses
#: the scripts' SET ... GET.
OLD_SERVER_SYNTAX_ERROR = (
    b"-ERR Error running script (call to f_16c72f2b7340fdd0a40c64804599abe2c82a87a9): "
    b"@user_script:31: ERR syntax error "
)


def test_a_server_before_redis_6_2_is_unsupported_with_a_clear_error() -> None:
    with answered_by(OLD_SERVER_SYNTAX_ERROR) as client:
        for prim in (
            Lock(client, "old-server", ttl=5.0),
            Semaphore(client, "old-server", 2, ttl=5.0),
            ReadWriteLock(client, "old-server", ttl=5.0).write(),
        ):
            with pytest.raises(BackendUnsupported) as caught:
                prim.acquire(blocking=False)
            message = str(caught.value)
            assert "needs Redis 6.2 or later" in message and prim.key in message, message
            assert type(caught.value.__cause__) is redis.exceptions.ResponseError
    # Other script errors, and Redis 7's wording of a syntax error (every
    # server since 6.2 parses the scripts), are not taken for an old server.
    for text in (
        "Error running script (call to f_0123): @user_script:3: @user_script: 3: -WRONGTYPE x",
        "syntax error script: beba64a791c781a176118458d5d82fb675f4cc15, on @user_script:1.",
    ):
        assert not transport.refused_as_too_old(redis.exceptions.ResponseError(text))
    assert transport.refused_as_too_old(
        redis.exceptions.ResponseError(OLD_SERVER_SYNTAX_ERROR[5:].decode())
    )


def test_a_demoted_sentinel_master_is_left_for_the_next_connect_before_redis_7() -> None:
    """redis-py's own read does this when Redis 7 reports READONLY plainly: the
    connection is closed, so that the next connect asks the sentinels again."""
    server = ErrorServer(WRAPPED_READONLY)
    try:
        pool = redis.sentinel.SentinelConnectionPool(
            "mymaster", redis.sentinel.Sentinel([]), is_master=True
        )
        conn = redis.sentinel.SentinelManagedConnection(
            connection_pool=pool, host="127.0.0.1", port=server.port, protocol=2
        )
        conn.connect = lambda: redis.connection.Connection.connect(conn)  # (no sentinel to ask)
        conn.connect()
        conn.send_command("EVALSHA", "0" * 40, 0)
        try:
            conn.read_response()
        except redis.exceptions.ResponseError as exc:
            error = translated(exc, conn)
        assert isinstance(error, redis.exceptions.ConnectionError), repr(error)
        assert isinstance(error.__cause__, redis.exceptions.ReadOnlyError)
        assert conn._sock is None  # disconnected
    finally:
        server.close()


class FixedSentinel(redis.sentinel.Sentinel):
    """A Sentinel client whose master is always at one address (no sentinel runs)."""

    def __init__(self, port: int) -> None:
        super().__init__([])
        self.port = port

    def discover_master(self, service_name: str) -> tuple[str, int]:
        return "127.0.0.1", self.port


def test_a_lock_on_a_demoted_sentinel_master_is_unavailable_before_redis_7() -> None:
    server = ErrorServer(WRAPPED_READONLY)
    try:
        client = FixedSentinel(server.port).master_for("mymaster", protocol=2, **no_retry())
        lock = Lock(client, "transport-errors", ttl=5.0)
        with pytest.raises(BackendUnavailable) as caught:
            lock.acquire(blocking=False)
        cause = caught.value.__cause__
        assert isinstance(cause, redis.exceptions.ConnectionError), repr(cause)
        assert isinstance(cause.__cause__, redis.exceptions.ReadOnlyError)
        client.close()
    finally:
        server.close()


def test_an_unreachable_server_is_unavailable() -> None:
    client = redis.Redis(port=free_port(), **no_retry())
    assert_unavailable(client, redis.exceptions.ConnectionError)


# -- replies read later ------------------------------------------------------------------------


def test_a_release_sent_is_done_before_its_reply_is_read(r: redis.Redis) -> None:
    lock = Lock(r, "transport-async", ttl=5.0)
    assert lock.acquire()
    pending = lock.release_async()
    wait_until(lambda: not r.exists(lock.key), 2, what="Redis to run the release")
    assert lock.token is None and lock not in _keeper.keeper().held()
    pending.wait()
    pending.wait()  # read once; asking again changes nothing


def test_a_release_whose_reply_is_lost_is_sent_again_and_found_done(
    r: redis.Redis, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    lock = Lock(client, "transport-reply-lost", ttl=5.0)
    assert lock.acquire()
    pending = lock.release_async()
    wait_until(lambda: not r.exists(lock.key), 2, what="Redis to run the release")
    r.client_kill_filter(_type="normal", skipme=True)  # the reply is lost with it
    pending.wait()  # sent again, finds the lock released: no LockLost
    assert not lock.lost


def test_a_release_after_the_lease_ran_out_reports_it_lost(r: redis.Redis) -> None:
    lock = Lock(r, "transport-async-lost", ttl=0.3, renew=False)
    assert lock.acquire()
    time.sleep(0.4)
    pending = lock.release_async()
    with pytest.raises(LockLost):
        pending.wait()
    assert lock.lost


class Interrupted(BaseException):
    """Stands in for an exception raised between send and read (a soft time limit)."""


def test_a_reply_left_unread_is_never_taken_for_the_next_one(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_url)
    first = Lock(client, "transport-unread-1", ttl=5.0)
    second = Lock(client, "transport-unread-2", ttl=5.0)
    first.acquire()  # a connection is open, the script loaded
    first.release()
    real = redis.Connection.read_response

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(redis.Connection, "read_response", real)
        raise Interrupted()

    monkeypatch.setattr(redis.Connection, "read_response", interrupted)
    with pytest.raises(Interrupted):
        first.acquire()  # sent: the script ran and granted a fence, unread
    assert second.acquire()
    # Its own reply, not the first one's.
    assert second.fence == int(client.get(second.keys.fence))  # type: ignore[arg-type]
    second.release()
    client.delete(first.key)


def test_a_reply_never_read_gives_its_connection_back_closed(redis_url: str) -> None:
    collect_earlier_garbage()
    client = redis.Redis.from_url(redis_url)
    pool = client.connection_pool
    lock = Lock(client, "transport-never-read", ttl=5.0)
    assert lock.acquire()
    pending = lock.release_async()
    assert len(pool._in_use_connections) == 1  # kept until the reply is read
    del pending
    gc.collect()
    assert len(pool._in_use_connections) == 0
    assert all(c._sock is None for c in pool._available_connections)


# -- waits ---------------------------------------------------------------------------


def test_waiters_never_take_a_bounded_pools_connection(redis_url: str, r: redis.Redis) -> None:
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=5)
    client = redis.Redis(connection_pool=pool)
    holder = Lock(client, "transport-bounded", ttl=0.6)  # renewed through the one connection
    assert holder.acquire()
    waiters = [Lock(client, "transport-bounded", ttl=5) for _ in range(3)]
    got: list[bool] = []

    def take_and_give_back(lock: Lock) -> None:
        got.append(lock.acquire(timeout=10))
        lock.release()

    threads = [threading.Thread(target=take_and_give_back, args=(w,)) for w in waiters]
    for t in threads:
        t.start()
    wait_until(lambda: blocked_clients(r) == 3, 3, what="three waiters to block")
    time.sleep(1.0)  # past the holder's lease: only renewal keeps it
    assert not holder.lost and holder.owned()
    holder.release()
    for t in threads:
        t.join(10)
    assert got == [True, True, True]
    assert not any(w.lost for w in waiters)


class _Finalized:
    """Notes how its socket stood when the garbage collector finalized it."""

    def __init__(self, seen: list[int]) -> None:
        self.seen = seen
        self.sock: Any = None

    def __del__(self) -> None:
        self.seen.append(self.sock.fileno())


def test_a_dropped_client_closes_its_waits_connections_before_anything_is_finalized(
    redis_url: str, r: redis.Redis
) -> None:
    """A wait's connection is kept for the next wait, outside the client's
    pool.  redis-py's connections sit in reference cycles with their pool, and
    the collector finalizes what it collects in no set order: a socket
    finalized before its connection would close with an "unclosed socket"
    ResourceWarning.  When the pool is collected, the kept sockets are closed
    first, before any finalizer of the pool's runs (here an object hung on
    the pool, made before the connections, so finalized ahead of them)."""
    collect_earlier_garbage()
    seen: list[int] = []
    client = redis.Redis.from_url(redis_url)
    probe = _Finalized(seen)
    client.connection_pool._test_probe = probe  # type: ignore[attr-defined]
    holder = Lock(client, "transport-dropped-client", ttl=5.0)
    waiter = Lock(client, "transport-dropped-client", ttl=5.0)
    hand_over(holder, waiter, r)
    waiter.release()
    (kept,) = getattr(client.connection_pool, _own._IDLE).conns
    probe.sock = kept._sock
    named = f"transport-dropped-{id(kept)}"
    kept.send_command("CLIENT", "SETNAME", named)
    assert kept.read_response() == b"OK"
    client.close()
    del client, holder, waiter, probe, kept
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert seen == [-1]  # closed before the probe's finalizer ran
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    wait_until(
        lambda: all(c["name"] != named for c in r.client_list()),
        3,
        what="the server to see the kept connection close",
    )


@pytest.mark.parametrize("connections", [1, 2])
def test_eight_threads_on_a_semaphore_of_2_through_a_bounded_pool_lose_no_lease(
    redis_url: str, r: redis.Redis, connections: int, lost_events: list[Any]
) -> None:
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=connections, timeout=5)
    client = redis.Redis(connection_pool=pool)
    holders: list[int] = []
    peak = 0
    guard = threading.Lock()
    outcomes: list[str] = []

    def work() -> None:
        nonlocal peak
        sem = Semaphore(client, "transport-bounded-sem", limit=2, ttl=0.5)
        try:
            if not sem.acquire(timeout=20):
                outcomes.append("timed out")
                return
            with guard:
                holders.append(1)
                peak = max(peak, len(holders))
            time.sleep(0.7)  # longer than the lease: renewal must get a connection
            with guard:
                holders.pop()
            lost = sem.lost
            sem.release()
            outcomes.append("lost" if lost else "ok")
        except Exception as exc:  # recorded, so the assertion shows it
            outcomes.append(repr(exc))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == ["ok"] * 8
    assert peak == 2
    assert lost_events == []
    assert r.keys("*transport-bounded-sem*") == [] or all(
        b"fence" in k for k in r.keys("*transport-bounded-sem*")
    )


# -- what the core costs to import, and what it keeps alive ------------------------------------


def test_the_primitives_import_no_celery() -> None:
    code = (
        "import sys; from celery_redislock import Lock, Semaphore, ReadWriteLock; "
        "print(sorted(m for m in sys.modules if m == 'celery' or m.startswith('celery.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_lock_dropped_without_release_stops_being_renewed(redis_url: str, r: redis.Redis) -> None:
    collect_earlier_garbage()
    client, trips = counting_client(redis_url)
    lock = Lock(client, "transport-dropped", ttl=0.6)
    assert lock.acquire()
    key = lock.key
    assert lock in _keeper.keeper().held()
    del lock
    gc.collect()
    trips.reset()
    wait_until(lambda: not r.exists(key), 3, what="the dropped lock's lease to run out")
    renewals = [send for send in trips.names() if send == ["EVALSHA"]]
    assert len(renewals) <= 1  # at most one already on its way
    assert _keeper.keeper().tokens() == []


def test_the_keeper_lets_go_of_a_client_whose_leases_are_released(redis_url: str) -> None:
    """Renewal keeps a client (a thread renews each client's leases) only while
    it has leases: released, then dropped, the client and its connections go."""
    collect_earlier_garbage()
    client = redis.Redis.from_url(redis_url)
    gone = weakref.ref(client)
    lock = Lock(client, "transport-let-go", ttl=0.3)  # renewed every 0.1 s
    assert lock.acquire()
    start = _keeper.keeper().round_trips
    wait_until(lambda: _keeper.keeper().round_trips >= start + 3, 3, what="renewals")
    lock.release()
    del lock, client

    def collected() -> bool:
        gc.collect()
        return gone() is None

    wait_until(collected, 3, what="the released client to be collected")


@pytest.mark.parametrize("over", ["tcp", "tls"])
@pytest.mark.parametrize("when", ["while blocked", "before the first call"])
def test_acquire_timeout_holds_when_the_connection_stalls(
    request: pytest.FixtureRequest, redis_url: str, r: redis.Redis, when: str, over: str
) -> None:
    """A partition (every byte dropped, sockets left open) during or before a
    wait: acquire(timeout=T) returns by T plus one connect timeout, and what
    it left queued is gone by then, so no later grant goes to nobody.  (A
    plain socket's wait ends by a receive timeout in the kernel, a TLS one's
    by its socket timeout.)"""
    tls: dict[str, Any] = {}
    if over == "tls":
        server = request.getfixturevalue("tls_server")
        port, tls = server.port, {"ssl": True, "ssl_cert_reqs": "none"}
        r = redis.Redis(port=port, **tls)
    else:
        port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    name = f"transport-stall-{over}-{when.replace(' ', '-')}"
    holder = Lock(r, name, ttl=10.0, renew=False)
    assert holder.acquire()
    timeout, connect = 2.0, 1.0
    with TcpProxy("127.0.0.1", port) as proxy:
        # (A new connection's handshake is bounded by socket_timeout.)
        client = redis.Redis(
            port=proxy.port, socket_connect_timeout=connect, socket_timeout=connect, **tls
        )
        waiter = Attempt(Lock(client, name, ttl=5.0), timeout)
        if when == "before the first call":
            client.ping()  # connected, then partitioned
            proxy.blackhole()
        waiter.start()
        if when == "while blocked":
            wait_until(lambda: blocked_clients(r) == 1, 2, what="the waiter to block")
            proxy.blackhole()
        waiter.join(timeout + connect + 5)
        assert not waiter.is_alive()
        client.close()
    assert waiter.ok is False or isinstance(waiter.error, BackendUnavailable), waiter.error
    assert waiter.seconds <= timeout + connect + 0.5, waiter.seconds  # (0.5: a loaded machine)
    # Nothing of the waiter is left in line: the holder's release frees the
    # lock (no hand-over to a waiter that gave up), and a newcomer gets it.
    time.sleep(0.1)
    holder.release()
    assert r.exists(holder.key) == 0
    newcomer = Lock(r, name, ttl=5.0)
    assert newcomer.acquire(blocking=False)
    newcomer.release()
    if over == "tls":
        r.close()
    # The stall's errors (and their tracebacks, kept by the Attempt) hold
    # connections in reference cycles: finalize them here, not in a later test.
    del waiter
    collect_earlier_garbage()


def test_a_wait_ends_at_its_bound_when_no_reply_comes(redis_url: str, r: redis.Redis) -> None:
    """A BLPOP whose reply never comes (the proxy holds it) is given up at
    its own timeout plus the margin, and its connection is closed; the next
    wait and the next deadline-bounded call on the thread's own connection
    get their socket timeout back."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with TcpProxy("127.0.0.1", port) as proxy:
        client = redis.Redis(port=proxy.port, socket_timeout=5.0)
        assert transport.wait_pop(client, "transport-bound", 0.05) is None  # Redis's nil
        conn = _own.take(client.connection_pool)
        assert conn._sock is not None and conn._sock.gettimeout() == 5.0
        assert conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == bytes(16)
        _own.give_back(client.connection_pool, conn)
        proxy.stall()
        started = time.monotonic()
        assert transport.wait_pop(client, "transport-bound", 0.3) is None
        took = time.monotonic() - started
        assert 0.3 + MARGIN - 0.02 <= took <= 0.3 + MARGIN + 0.2, took
        proxy.resume()
        r.rpush("transport-bound-next", b"x")
        assert transport.wait_pop(client, "transport-bound-next", 1.0) == b"x"  # reconnected
        client.close()
        # The stalled waits' errors hold the thread's own connections in cycles:
        # collect them here, not in whichever test runs next.
        del client, conn
        collect_earlier_garbage()
