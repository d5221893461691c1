"""The lock protocol without Redis: every call it builds and every reply it reads.

Reply shapes are the ones the headers of ``primitives/lua/*.lua`` promise.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from celery_redislock.primitives import keys, protocol
from celery_redislock.primitives.kinds import Kind, Mode
from celery_redislock.primitives.protocol import (
    DEFAULT_RESERVE_MS,
    GRACE_MS,
    Call,
    Duplicate,
    Granted,
    OverRate,
    Queued,
    Recovered,
    Released,
    Superseded,
)
from celery_redislock.primitives.rates import Start, rate

LOCK = keys.lock_keys("p", "name")
SEM = keys.multi_keys("p", "name", Kind.SEMAPHORE)
RW = keys.multi_keys("p", "name", Kind.RWLOCK)


@dataclass(frozen=True)
class Claim:
    key: str = "p:{name}:unique"
    text: str = "s:10:0::job-1"

    def arg(self) -> str:
        return self.text


# -- Kind and Mode -----------------------------------------------------------------


def test_each_kind_keeps_the_key_infix_and_index_prefix_already_in_stores() -> None:
    assert [(k.infix, k.index_prefix, k.value) for k in Kind] == [
        (None, "lock", "lock"),
        ("sem", "sem", "semaphore"),
        ("rw", "rw", "rwlock"),
    ]
    assert SEM.holders == "p:{name}:sem:holders" and RW.holders == "p:{name}:rw:holders"
    assert keys.multi_keys("p", "name", "sem") == SEM  # the infix, as older callers pass it


@pytest.mark.parametrize(
    ("given", "kind"),
    [
        (None, Kind.LOCK),
        ("sem", Kind.SEMAPHORE),
        ("rw", Kind.RWLOCK),
        ("semaphore", Kind.SEMAPHORE),
        ("lock", Kind.LOCK),
        (Kind.RWLOCK, Kind.RWLOCK),
    ],
)
def test_kind_of_reads_a_kind_its_value_or_its_infix(given: object, kind: Kind) -> None:
    assert Kind.of(given) is kind  # type: ignore[arg-type]


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        Kind.of("mutex")
    with pytest.raises(ValueError):
        Kind.of_infix("x")
    assert Kind.of_index_prefix("unique") is None
    assert [Kind.of_index_prefix(k.index_prefix) for k in Kind] == list(Kind)


def test_kinds_name_their_scripts_and_nouns() -> None:
    assert Kind.LOCK.scripts.acquire == "lock_acquire" and not Kind.LOCK.multi
    assert Kind.SEMAPHORE.scripts == Kind.RWLOCK.scripts
    assert Kind.RWLOCK.scripts.recover == "multi_recover" and Kind.RWLOCK.multi
    assert [k.noun for k in Kind] == ["lock", "semaphore", "read-write lock"]
    assert [(m.value, m.noun) for m in Mode] == [
        ("s", "semaphore"),
        ("r", "read lock"),
        ("x", "write lock"),
    ]
    assert Mode("r") is Mode.READ and str(Mode.WRITE) == "x" and str(Kind.SEMAPHORE) == "semaphore"


def test_of_kind_builds_each_kind_s_keys() -> None:
    assert keys.of_kind(Kind.LOCK, "p", "name") == LOCK
    assert keys.of_kind(Kind.SEMAPHORE, "p", "name") == SEM
    assert keys.of_kind_at(Kind.RWLOCK, keys.tag("p", "name")) == RW
    with pytest.raises(ValueError):
        keys.multi_keys("p", "name", Kind.LOCK)


# -- calls -------------------------------------------------------------------------


def test_an_uncontended_lock_acquire_sends_six_arguments() -> None:
    """The hot path leaves the park arguments out: the script defaults them."""
    assert protocol.acquire_args(LOCK, "tok", 30000, 0, 600000) == [
        "tok",
        30000,
        0,
        LOCK.wake,
        GRACE_MS,
        600000,
    ]
    call = protocol.acquire(Kind.LOCK, LOCK, "tok", 30000, 0, 600000)
    assert call == Call("lock_acquire", LOCK.script_keys, call.args) and len(call.args) == 6


def test_a_park_sends_payload_reservation_and_place_in_line() -> None:
    args = protocol.acquire_args(
        LOCK, "tok", 1000, 0, 5000, payload=b"msg", reserve_ms=7, parked_run=True, order_ms=12.5
    )
    # ARGV[7..10] of lock_acquire.lua: payload, reservation, parked run, place in line.
    assert args[6:] == [b"msg", 7, 1, 12.5]
    arrival = protocol.acquire_args(LOCK, "tok", 1000, 0, 5000, payload=b"msg")
    assert arrival[6:] == [b"msg", DEFAULT_RESERVE_MS, 0, ""]


def test_a_semaphore_acquire_sends_mode_and_limit_then_the_claim() -> None:
    claim = Claim()
    call = protocol.acquire(
        Kind.SEMAPHORE, SEM, "tok", 1000, 50, 5000, mode=Mode.PERMIT, limit=3, claim=claim
    )
    assert call.script == "multi_acquire"
    assert call.keys == [*SEM.script_keys, claim.key]  # KEYS[8]: the claim
    # ARGV[11] mode, ARGV[12] limit, ARGV[#ARGV] the claim.
    assert call.args == [
        *["tok", 1000, 50, SEM.wake, GRACE_MS, 5000, "", DEFAULT_RESERVE_MS, 0, ""],
        *["s", 3, claim.text],
    ]
    full = protocol.acquire_args(SEM, "tok", 1000, 50, 5000, mode=Mode.READ, claim=claim)
    assert full[10:] == ["r", 0, claim.text]


def test_a_start_under_a_rate_limit_rides_before_the_claim() -> None:
    start = Start(keys.rate_key("p", "name"), rate("4/s", "test"))
    claim = Claim()
    call = protocol.acquire(Kind.LOCK, LOCK, "tok", 1000, 0, 5000, claim=claim, start=start)
    # KEYS[7] the rate key, KEYS[8] the claim; the start's argument last but the claim's.
    assert call.keys == [*LOCK.script_keys, start.key, claim.key]
    assert call.args == [
        *["tok", 1000, 0, LOCK.wake, GRACE_MS, 5000, "", DEFAULT_RESERVE_MS, 0, ""],
        *["rate:250000.0:1", claim.text],
    ]
    alone = protocol.acquire(Kind.LOCK, LOCK, "tok", 1000, 0, 5000, start=start)
    assert alone.keys == [*LOCK.script_keys, start.key]
    assert alone.args[-1] == "rate:250000.0:1"


@pytest.mark.parametrize(
    ("options", "tail"),
    [
        ({}, []),
        ({"reserve_ms": 5}, [0, 5]),
        ({"prefix_match": True}, [1, DEFAULT_RESERVE_MS]),
        ({"claim": Claim()}, [0, DEFAULT_RESERVE_MS, "s:10:0::job-1"]),
    ],
)
def test_release_arguments_leave_out_what_the_script_defaults(
    options: dict[str, object], tail: list[object]
) -> None:
    args = protocol.release_args(LOCK, "tok", 900, **options)  # type: ignore[arg-type]
    assert args == ["tok", LOCK.wake, 900, *tail]
    call = protocol.release(Kind.RWLOCK, RW, "tok", 900, **options)
    assert call.script == "multi_release"
    assert call.keys[:7] == RW.script_keys
    assert len(call.keys) == 7 + ("claim" in options)


def test_the_other_calls() -> None:
    assert protocol.cancel(Kind.LOCK, LOCK, "tok", 900) == Call(
        "lock_cancel", LOCK.script_keys, ["tok", LOCK.wake, DEFAULT_RESERVE_MS, 900]
    )
    assert protocol.extend(Kind.LOCK, LOCK, "tok", 3000) == Call(
        "lock_extend", [LOCK.lock], ["tok", 3000]
    )
    assert protocol.extend(Kind.SEMAPHORE, SEM, "tok", 3000) == Call(
        "multi_extend", [SEM.holders, SEM.info], ["tok", 3000]
    )
    assert protocol.recover(Kind.RWLOCK, RW, 900, 20) == Call(
        "multi_recover", RW.script_keys, [RW.wake, 20, 900]
    )
    assert protocol.park_drop(SEM, "tok") == Call(
        "park_drop", [SEM.queue, SEM.meta, SEM.pmsg, SEM.inflight], ["tok"]
    )
    assert protocol.retoken(Kind.LOCK, LOCK, "a", "b").args == ["a", "b", ""]
    assert protocol.retoken(Kind.SEMAPHORE, SEM, "a", "b") == Call(
        "retoken", SEM.script_keys, ["a", "b", "m"]
    )
    assert protocol.lead_key(LOCK) == LOCK.lock and protocol.lead_key(SEM) == SEM.holders
    assert protocol.to_ms(0.0001) == 1 and protocol.to_ms(2.5) == 2500


# -- replies -------------------------------------------------------------------------


def test_acquire_replies() -> None:
    # the bare fence: held, nothing handed over
    assert protocol.parse_acquire(7) == Granted(7, [])
    # {1, fence, '', now, pairs...}: held, and parked runs granted too
    assert protocol.parse_acquire([1, 8, b"", 123, b"t1", b"p1", b"t2", b"p2"]) == Granted(
        8, [("t1", b"p1"), ("t2", b"p2")]
    )
    # {0, holder's lease ms, holder, now, pairs...}
    assert protocol.parse_acquire([0, 2500, b"holder|w|1", 99]) == Queued(
        "holder|w|1", 2500, 99, []
    )
    assert protocol.parse_acquire([-1, 0, b"", 5, b"t", b"p"]) == Duplicate([("t", b"p")])
    # {-2, 0, job, 0}
    assert protocol.parse_acquire([-2, 0, b"job-2", 0]) == Superseded("job-2", [])
    # {-3, µs until a start is free, '', 0}
    assert protocol.parse_acquire([-3, 250000, b"", 0]) == OverRate(0.25, [])
    with pytest.raises(ValueError):
        protocol.parse_acquire([5, 0, b"", 0])


def test_cancel_replies_parse_as_acquire_replies() -> None:
    # lock_cancel.lua: {1, fence, ...} held after all, else {0, 0, '', now, pairs...}
    assert protocol.parse_acquire([1, 4, b"", 10]) == Granted(4, [])
    assert protocol.parse_acquire([0, 0, b"", 10, b"t", b"p"]) == Queued("", 0, 10, [("t", b"p")])


def test_release_replies() -> None:
    assert protocol.parse_release(1) == Released(True, [])
    assert protocol.parse_release([1, 555, b"t", b"p"]) == Released(True, [("t", b"p")])
    assert protocol.parse_release([0]) == Released(False, [])


def test_recover_extend_retoken_and_park_drop_replies() -> None:
    assert protocol.parse_recover([-1]) == Recovered(-1, [])
    assert protocol.parse_recover([1700, b"t", b"p"]) == Recovered(1700, [("t", b"p")])
    assert protocol.parse_extend(1) is True and protocol.parse_extend(0) is False
    assert protocol.parse_retoken(1) is True and protocol.parse_retoken(0) is False
    assert protocol.parse_park_drop(None) is None  # false: not parked there
    assert protocol.parse_park_drop([b"msg", 1]) == (b"msg", True)
    assert protocol.parse_park_drop([b"msg", 0]) == (b"msg", False)


def test_a_wake_up_and_the_lease_it_starts() -> None:
    assert protocol.parse_wake(b"12:5000") == (12, 5000)
    assert protocol.parse_wake(b"12") == (12, None)
    # Sent at local 100.0 when the server said 4000 ms; granted at 5000 ms.
    assert protocol.lease_start(100.0, 4000, 5000) == pytest.approx(101.0)
    assert protocol.lease_start(100.0, 4000, None) == 100.0


def test_handoffs_decode_tokens_and_keep_payloads() -> None:
    assert protocol.handoffs([]) == [] and protocol.handoffs(None) == []
    assert protocol.handoffs([b"\xff", b"\x00raw"]) == [("\ufffd", b"\x00raw")]
    assert protocol.decode(b"a") == "a" and protocol.decode(3) == "3"
