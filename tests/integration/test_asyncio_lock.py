"""The asyncio Lock against a real redis-server: exclusion, FIFO wake-ups, hand-over
with the sync Lock, renewal, loss, cancellation, deadlines.

Each test drives its coroutine with ``asyncio.run``.  Round trips are counted
client-side (tests.asyncio_support.counting_client), never inferred from
timings; timings use time.monotonic().
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from celery_redislock import (
    BackendUnavailable,
    ConfigurationError,
    LockLost,
    LockNotOwned,
    LockTimeout,
)
from celery_redislock import Lock as SyncLock
from celery_redislock.asyncio import Lock, calls, renewal, waits
from celery_redislock.primitives import protocol
from celery_redislock.primitives.protocol import Kind
from tests.asyncio_support import close, counting_client, no_renewals, wait_for
from tests.helpers import TcpProxy, assert_rising, sha

pytestmark = pytest.mark.usefixtures("no_leaked_leases")


def evalsha_of(trips: Any, script: str) -> int:
    """How many EVALSHA of ``script`` went out."""
    return sum(
        1
        for send in trips.sends
        for c in send
        if c[0].upper() == b"EVALSHA" and c[1] == sha(script)
    )


def sent(trips: Any, name: bytes) -> int:
    return sum(1 for send in trips.sends for c in send if c[0].upper() == name)


async def queued(client: Any, lock: Lock, n: int) -> None:
    await wait_for(lambda: client.zcard(lock.keys.queue), what="a waiter to queue")
    await wait_for(lambda: _equals(client.zcard(lock.keys.queue), n), what=f"{n} waiter(s) in line")


async def _equals(count: Any, n: int) -> bool:
    return int(await count) == n


# -- exclusion and hand-over ---------------------------------------------------


def test_coroutines_never_overlap_and_fences_rise(r: redis.Redis, redis_url: str) -> None:
    async def body() -> tuple[int, list[int]]:
        async with counting_client(redis_url) as (client, _):
            inside, peak, fences = 0, 0, []

            async def worker() -> None:
                nonlocal inside, peak
                for _ in range(4):
                    async with Lock(client, "counted", ttl=5) as lock:
                        inside += 1
                        peak = max(peak, inside)
                        fences.append(lock.fence)
                        await asyncio.sleep(0.001)
                        inside -= 1

            await asyncio.gather(*(worker() for _ in range(20)))
            await no_renewals()
            return peak, fences

    peak, fences = asyncio.run(body())
    assert peak == 1
    assert len(fences) == 80
    assert_rising(fences)


def test_waiters_are_woken_in_order_without_polling(r: redis.Redis, redis_url: str) -> None:
    """Each waiter sends one acquire, waits once (BLPOP) and is woken by the
    release before it: no second acquire, no second wait, while the event
    loop keeps running other coroutines."""

    async def body() -> tuple[list[int], Any, int, float]:
        async with counting_client(redis_url) as (client, trips):
            warm = Lock(client, "fifo-warm", ttl=10)  # every script loaded before counting
            assert await warm.acquire()
            await warm.release()
            holder = Lock(client, "fifo", ttl=10)
            assert await holder.acquire()
            order: list[int] = []
            waiters = [Lock(client, "fifo", ttl=10) for _ in range(5)]

            async def wait(i: int) -> None:
                assert await waiters[i].acquire()
                order.append(i)
                await waiters[i].release()

            tasks = []
            for i in range(5):
                tasks.append(asyncio.create_task(wait(i)))
                await queued(client, holder, i + 1)
            ticks = 0
            until = time.monotonic() + 0.3
            while time.monotonic() < until:  # the loop is free while they wait
                ticks += 1
                await asyncio.sleep(0.01)
            trips.reset()
            started = time.monotonic()
            await holder.release()
            await asyncio.gather(*tasks)
            elapsed = time.monotonic() - started
            await no_renewals()
            return order, trips, ticks, elapsed

    order, trips, ticks, elapsed = asyncio.run(body())
    assert order == [0, 1, 2, 3, 4]
    assert ticks >= 15
    # From the holder's release on: 6 releases, and nothing else of the waiters
    # (their acquires and BLPOPs went out before; a re-asked acquire would show).
    assert evalsha_of(trips, "lock_release") == 6
    assert evalsha_of(trips, "lock_acquire") == 0
    assert sent(trips, b"BLPOP") == 0
    assert elapsed < 1.0


def test_waiters_send_one_acquire_and_one_wait_each(r: redis.Redis, redis_url: str) -> None:
    async def body() -> Any:
        async with counting_client(redis_url) as (client, trips):
            holder = Lock(client, "one wait", ttl=10)
            assert await holder.acquire()
            waiters = [Lock(client, "one wait", ttl=10) for _ in range(3)]

            async def wait(lock: Lock) -> None:
                async with lock:
                    pass

            tasks = [asyncio.create_task(wait(w)) for w in waiters]
            await queued(client, holder, 3)
            await asyncio.sleep(0.05)
            await holder.release()
            await asyncio.gather(*tasks)
            await no_renewals()
            return trips

    trips = asyncio.run(body())
    assert evalsha_of(trips, "lock_acquire") == 4
    assert sent(trips, b"BLPOP") == 3
    assert evalsha_of(trips, "lock_release") == 4


def test_sync_and_asyncio_holders_hand_over_both_ways(r: redis.Redis, redis_url: str) -> None:
    sync_client = redis.Redis.from_url(redis_url)

    async def body() -> list[int]:
        async with counting_client(redis_url) as (client, _):
            first = SyncLock(sync_client, "mixed", ttl=10)
            assert first.acquire()
            waiter = Lock(client, "mixed", ttl=10)
            task = asyncio.create_task(waiter.acquire(timeout=5))
            await queued(client, waiter, 1)
            first.release()  # hands over to the asyncio waiter
            assert await task
            assert first.fence is None
            fences = [waiter.fence]
            assert await waiter.owned()

            last = SyncLock(sync_client, "mixed", ttl=10)
            got: list[bool] = []
            thread = threading.Thread(target=lambda: got.append(last.acquire(timeout=5)))
            thread.start()
            await queued(client, waiter, 1)
            await waiter.release()  # hands over to the sync waiter
            await asyncio.to_thread(thread.join, 5)
            assert got == [True]
            fences.append(last.fence)
            last.release()
            await no_renewals()
            return fences

    try:
        fences = asyncio.run(body())
    finally:
        sync_client.close()
    assert all(fence is not None for fence in fences)
    assert_rising(fences)


def test_a_wait_connection_is_kept_for_the_next_wait(r: redis.Redis, redis_url: str) -> None:
    """Two blocking acquires in turn wait on one connection: kept idle in
    between, and closed as the event loop ends."""

    async def body() -> tuple[list[int], int]:
        async with counting_client(redis_url, client_name="kept-waits") as (client, _):
            holder = Lock(client, "kept", ttl=10)
            assert await holder.acquire()
            seen = []
            for _ in range(2):
                waiter = Lock(client, "kept", ttl=10)
                task = asyncio.create_task(waiter.acquire(timeout=5))
                await queued(client, holder, 1)
                await holder.release()
                assert await task
                [conns] = waits._idle[asyncio.get_running_loop()].conns.values()
                seen += [id(conn) for conn, _, _ in conns]
                holder = waiter
            await holder.release()
            await no_renewals()
            return seen, waits.idle_connections()

    seen, idle = asyncio.run(body())
    assert len(seen) == 2 and seen[0] == seen[1]
    assert idle == 1
    # asyncio.run cancelled the task that keeps it: closed (no ResourceWarning).
    for _ in range(100):
        waiting = [c for c in r.client_list() if c.get("name") == "kept-waits"]
        if not waiting:
            break
        time.sleep(0.01)
    assert waiting == [], waiting


# -- renewal and loss ----------------------------------------------------------


def test_renewal_keeps_leases_with_one_round_trip_per_interval(
    r: redis.Redis, redis_url: str
) -> None:
    async def body() -> tuple[list[int], list[int], int, bool]:
        async with counting_client(redis_url) as (client, trips):
            locks = [Lock(client, f"renewed-{i}", ttl=0.6, renew_interval=0.2) for i in range(5)]
            await calls.load(client, "lock_extend", locks[0].key)  # (no NOSCRIPT round)
            for lock in locks:
                assert await lock.acquire()
            renewer = renewal.renewer_for(client)
            trips.reset()
            before = renewer.round_trips
            await asyncio.sleep(1.5)  # 2.5 leases
            # (Read together, with no await between: no round goes out meanwhile.)
            rounds = renewer.round_trips - before
            per_round = [
                sum(1 for c in send if c[0].upper() == b"EVALSHA" and c[1] == sha("lock_extend"))
                for send in trips.sends
            ]
            owned = all([await lock.owned() for lock in locks])
            for lock in locks:
                await lock.release()
            await no_renewals()
            return (
                [n for n in per_round if n],
                [int(r.pttl(lock.key)) for lock in locks],
                rounds,
                owned,
            )

    per_round, pttls, rounds, owned = asyncio.run(body())
    assert owned
    assert all(n == 5 for n in per_round), per_round  # every round renews all five
    assert 5 <= len(per_round) <= 9, per_round  # about 1.5 / 0.2
    assert rounds == len(per_round)
    assert pttls == [-2] * 5


def test_a_lease_found_gone_is_lost(
    r: redis.Redis, redis_url: str, lost_events: list[tuple[Any, str]]
) -> None:
    async def body() -> tuple[Lock, list[str]]:
        async with counting_client(redis_url) as (client, _):
            seen: list[str] = []
            lock = Lock(
                client,
                "taken",
                ttl=0.6,
                renew_interval=0.1,
                on_lost=lambda _, why: seen.append(why),
            )
            assert await lock.acquire()
            r.delete(lock.key)
            await wait_for(lambda: lock.lost, 1.0, "the loss to be seen")
            with pytest.raises(LockLost):
                await lock.release()
            await no_renewals()
            return lock, seen

    lock, seen = asyncio.run(body())
    assert seen == ["the lease had expired or was taken over before renewal"]
    assert [lease for lease, _ in lost_events] == [lock]


def test_a_stalled_event_loop_loses_its_lease(
    r: redis.Redis, redis_url: str, lost_events: list[tuple[Any, str]]
) -> None:
    async def body() -> Lock:
        async with counting_client(redis_url) as (client, _):
            lock = Lock(client, "stalled", ttl=0.3, renew_interval=0.1)
            assert await lock.acquire()
            time.sleep(0.4)  # the event loop stalls past the lease
            await wait_for(lambda: lock.lost, 1.0, "the loss to be seen")
            with pytest.raises(LockLost):
                await lock.release()
            await no_renewals()
            return lock

    lock = asyncio.run(body())
    [(lease, reason)] = lost_events
    assert lease is lock
    assert reason.startswith("no renewal succeeded within the lease (0.3 s)")


# -- cancellation ----------------------------------------------------------------


def test_a_cancelled_acquire_leaves_no_place_in_line(r: redis.Redis, redis_url: str) -> None:
    async def body() -> tuple[int, int, bool]:
        async with counting_client(redis_url) as (client, _):
            holder = Lock(client, "cancelled", ttl=10)
            assert await holder.acquire()
            waiter = Lock(client, "cancelled", ttl=10)
            task = asyncio.create_task(waiter.acquire())
            await queued(client, holder, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            in_line = int(await client.zcard(holder.keys.queue))
            meta = int(await client.hlen(holder.keys.meta))
            await holder.release()
            # Nobody is granted it: the cancelled waiter had left the line.
            still_locked = bool(await client.exists(holder.key))
            await no_renewals()
            return in_line, meta, still_locked

    in_line, meta, still_locked = asyncio.run(body())
    assert (in_line, meta) == (0, 0)
    assert not still_locked


def test_a_grant_racing_the_cancellation_is_released(r: redis.Redis, redis_url: str) -> None:
    sync_client = redis.Redis.from_url(redis_url)

    async def body() -> tuple[bool, Any]:
        async with counting_client(redis_url) as (client, _):
            holder = SyncLock(sync_client, "raced", ttl=10)
            assert holder.acquire()
            waiter = Lock(client, "raced", ttl=10)
            task = asyncio.create_task(waiter.acquire())
            await queued(client, waiter, 1)
            # The release grants the waiter while the event loop is not running;
            # the cancellation reaches it before it hears of the grant.
            holder.release()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            locked = bool(await client.exists(waiter.key))
            await no_renewals()
            return locked, waiter.token

    try:
        locked, token = asyncio.run(body())
    finally:
        sync_client.close()
    assert not locked
    assert token is None


def test_a_cancelled_release_still_releases(r: redis.Redis, redis_url: str) -> None:
    """Cancelled while its reply is on the way (held by a stalled proxy), the
    release finishes: the lock goes to the waiter, and the object knows it
    released (it did not lose the lease)."""
    kwargs = r.connection_pool.connection_kwargs

    async def body() -> tuple[bool, Any, bool, bool, float]:
        with TcpProxy(kwargs["host"], kwargs["port"]) as proxy:
            client = redis.asyncio.Redis.from_url(proxy.url)
            direct = redis.asyncio.Redis.from_url(redis_url)
            try:
                lock = Lock(client, "released anyway", ttl=10)
                assert await lock.acquire()
                waiter = Lock(direct, "released anyway", ttl=10)
                waiting = asyncio.create_task(waiter.acquire(timeout=5))
                await queued(direct, lock, 1)
                proxy.stall()
                task = asyncio.create_task(lock.release())
                await asyncio.sleep(0.05)  # sent, held by the proxy
                task.cancel()
                asyncio.get_running_loop().call_later(0.1, proxy.resume)
                started = time.monotonic()
                with pytest.raises(asyncio.CancelledError):
                    await task
                waited = time.monotonic() - started
                handed = await waiting
                await waiter.release()
                locked = bool(r.exists(lock.key))
                # Taken again at once by another: nothing was left behind.
                other = Lock(client, "released anyway", ttl=10)
                free = await other.acquire(blocking=False)
                await other.release()
                await no_renewals()
                return handed and not locked, lock.token, lock.lost, free, waited
            finally:
                proxy.resume()
                await close(client)
                await close(direct)

    handed, token, lost, free, waited = asyncio.run(body())
    assert (handed, token, lost, free) == (True, None, False, True)
    assert waited >= 0.05  # the cancellation waited for the release to finish


class ReplyHeldConnection(redis.asyncio.Connection):
    """Holds back the reply of a command sent while ``hold`` is set: it has
    run in Redis, its reply is not read yet; a cancellation then drops the
    connection, as redis-py does with one cut short while reading."""

    hold = False
    held = False

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        self.held = ReplyHeldConnection.hold
        await super().send_packed_command(*args, **kwargs)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        if self.held:
            self.held = False
            try:
                await asyncio.sleep(10)
            except BaseException:
                await self.disconnect(nowait=True)
                raise
        return await super().read_response(*args, **kwargs)


def test_a_release_cancelled_after_it_ran_is_not_taken_for_a_lost_lease(
    r: redis.Redis, redis_url: str
) -> None:
    """The release ran (and handed over), its reply was cut short: the call
    sent again finds nothing to release, which is no loss while the lease was
    alive."""

    async def body() -> tuple[bool, bool, Any]:
        pool = redis.asyncio.ConnectionPool.from_url(
            redis_url, connection_class=ReplyHeldConnection
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        try:
            lock = Lock(client, "ran, reply lost", ttl=10)
            assert await lock.acquire()
            await calls.load(client, "lock_release", lock.key)  # (no NOSCRIPT round)
            waiter = Lock(client, "ran, reply lost", ttl=10)
            waiting = asyncio.create_task(waiter.acquire(timeout=5))
            await queued(client, lock, 1)
            ReplyHeldConnection.hold = True
            task = asyncio.create_task(lock.release())
            fence = lock.fence
            await wait_for(lambda: int(r.get(lock.keys.fence)) > fence, what="the hand-over")
            ReplyHeldConnection.hold = False
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            handed = await waiting
            await waiter.release()
            await no_renewals()
            return handed, lock.lost, lock.token
        finally:
            ReplyHeldConnection.hold = False
            await close(client)

    assert asyncio.run(body()) == (True, False, None)


def test_a_release_cancelled_before_it_ran_can_be_sent_again(
    r: redis.Redis, redis_url: str
) -> None:
    async def body() -> tuple[bool, bool, bool]:
        async with counting_client(redis_url) as (client, _):
            lock = Lock(client, "not yet released", ttl=10)
            assert await lock.acquire()
            task = asyncio.create_task(lock.release())
            task.cancel()  # before it started: nothing was sent
            with pytest.raises(asyncio.CancelledError):
                await task
            owned = await lock.owned()
            await lock.release()
            locked = bool(await client.exists(lock.key))
            await no_renewals()
            return owned, locked, lock.token is None

    assert asyncio.run(body()) == (True, False, True)


# -- deadlines and errors ----------------------------------------------------------


def test_acquire_returns_by_its_timeout(r: redis.Redis, redis_url: str) -> None:
    async def body() -> tuple[bool, float, int]:
        async with counting_client(redis_url) as (client, _):
            holder = Lock(client, "timed", ttl=10)
            assert await holder.acquire()
            started = time.monotonic()
            got = await Lock(client, "timed", ttl=10).acquire(timeout=0.3)
            elapsed = time.monotonic() - started
            in_line = int(await client.zcard(holder.keys.queue))
            with pytest.raises(LockTimeout):
                async with Lock(client, "timed", ttl=10, timeout=0.05):
                    pass
            await holder.release()
            await no_renewals()
            return got, elapsed, in_line

    got, elapsed, in_line = asyncio.run(body())
    assert not got
    assert 0.3 <= elapsed < 0.3 + calls.CONNECT_TIMEOUT
    assert in_line == 0


def test_acquire_on_a_partitioned_server_returns_by_its_timeout_and_a_connect_timeout(
    r: redis.Redis,
) -> None:
    kwargs = r.connection_pool.connection_kwargs

    async def body() -> tuple[Any, float]:
        with TcpProxy(kwargs["host"], kwargs["port"]) as proxy:
            client = redis.asyncio.Redis.from_url(proxy.url, socket_connect_timeout=0.3)
            try:
                await client.ping()
                proxy.blackhole()
                started = time.monotonic()
                try:
                    outcome: Any = await Lock(client, "partitioned", ttl=5).acquire(timeout=0.4)
                except BackendUnavailable as exc:
                    outcome = exc
                return outcome, time.monotonic() - started
            finally:
                proxy.close()
                await close(client)

    outcome, elapsed = asyncio.run(body())
    assert outcome is False or isinstance(outcome, BackendUnavailable)
    assert 0.4 <= elapsed < 0.4 + 0.3 + 0.4  # timeout, one connect timeout, slack


def test_an_unreachable_server_raises_backend_unavailable() -> None:
    from tests.redis_server import free_port

    async def body() -> list[str]:
        # (No retries: redis-py 6 and later retry a refused connection with backoff.)
        client = redis.asyncio.Redis(
            port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
        )
        errors = []
        try:
            for op in (
                lambda: Lock(client, "nowhere").acquire(),
                lambda: Lock(client, "nowhere").acquire(timeout=0.5),
                lambda: Lock(client, "nowhere").locked(),
            ):
                with pytest.raises(BackendUnavailable) as caught:
                    await op()
                errors.append(str(caught.value))
        finally:
            await close(client)
        return errors

    errors = asyncio.run(body())
    assert all("Redis unreachable during" in e for e in errors), errors


def test_wrong_use_and_options_raise(redis_url: str) -> None:
    async def body() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            with pytest.raises(LockNotOwned):
                await Lock(client, "unused").release()
            with pytest.raises(LockNotOwned):
                await Lock(client, "unused").extend()
            with pytest.raises(ValueError):
                await Lock(client, "unused").acquire(blocking=False, timeout=1)
        finally:
            await close(client)

    asyncio.run(body())
    with pytest.raises(ConfigurationError, match="wait_replicas of lock 'x'"):
        Lock(None, "x", wait_replicas=1)
    with pytest.raises(ConfigurationError, match="ttl of lock 'x'"):
        Lock(None, "x", ttl=-1)


def test_extend_resets_the_lease(r: redis.Redis, redis_url: str) -> None:
    async def body() -> tuple[int, int]:
        async with counting_client(redis_url) as (client, _):
            lock = Lock(client, "extended", ttl=2, renew=False)
            assert await lock.acquire()
            await lock.extend(30)
            longer = int(r.pttl(lock.key))
            r.delete(lock.key)
            with pytest.raises(LockLost):
                await lock.extend()
            return longer, int(r.exists(lock.key))

    longer, exists = asyncio.run(body())
    assert 20000 < longer <= 30000
    assert exists == 0


# -- parked runs -------------------------------------------------------------------


def test_a_release_hands_parked_runs_to_on_handoff(
    r: redis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> list[Any]:
        async with counting_client(redis_url) as (client, _):
            handed: list[Any] = []
            for label, on_handoff in (("given", handed.append), ("none", None)):
                lock = Lock(client, f"parked-{label}", ttl=10)
                lock.on_handoff = on_handoff
                assert await lock.acquire()
                park = protocol.acquire(
                    Kind.LOCK, lock.keys, f"parked-{label}", 10000, 0, 600000, payload=b"message"
                )
                assert isinstance(
                    protocol.parse_acquire(await calls.run(client, park)), protocol.Queued
                )
                await lock.release()
            await no_renewals()
            return handed

    with caplog.at_level(logging.ERROR, logger="celery_redislock.renewal"):
        handed = asyncio.run(body())
    assert handed == [[("parked-given", b"message")]]
    assert any("no on_handoff" in m for m in caplog.messages), caplog.messages


def test_a_decoding_client_reads_script_replies_undecoded(r: redis.Redis, redis_url: str) -> None:
    """With ``decode_responses=True`` the scripts' replies still come back as
    bytes (NEVER_DECODE): a parked payload that is not text is handed over whole."""

    async def body() -> tuple[list[Any], bool, bool]:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        try:
            handed: list[Any] = []
            holder = Lock(client, "decoded", ttl=10)
            assert await holder.acquire()
            waiter = Lock(client, "decoded", ttl=10)
            waiter.on_handoff = handed.append
            task = asyncio.create_task(waiter.acquire(timeout=5))
            await queued(client, holder, 1)
            park = protocol.acquire(
                Kind.LOCK, holder.keys, "parked", 10000, 0, 600000, payload=b"\xff\x00"
            )
            await calls.run(client, park)
            await holder.release()
            got = await task
            owned = await waiter.owned()
            await waiter.release()  # grants the parked run
            await no_renewals()
            return handed, got, owned
        finally:
            await close(client)

    handed, got, owned = asyncio.run(body())
    assert got and owned
    assert handed == [[("parked", b"\xff\x00")]]
