"""Rates without Redis: parsing every form, refusing bad ones by name, and the
``rate_acquire`` call and reply shapes (the header of ``lua/rate_acquire.lua``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from celery_redislock import ConfigurationError, RateLimiter
from celery_redislock import asyncio as aio
from celery_redislock.primitives import keys
from celery_redislock.primitives.rates import (
    MAX_PER_SECOND,
    MIN_PER_SECOND,
    Rate,
    Slot,
    parse_slot,
    rate,
    slot_call,
)

# -- parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "per_second"),
    [
        ("10/s", 10.0),
        ("100/m", 100 / 60),
        ("1000/h", 1000 / 3600),
        ("5/d", 5 / 86400),
        (" 10 / s ", 10.0),
        ("2.5/s", 2.5),
        ("1e3/m", 1000 / 60),
        ("10", 10.0),  # Celery's bare number: so many a second
        ("0.5", 0.5),
        (10, 10.0),
        (2.5, 2.5),
        (0.001, 0.001),
        (MAX_PER_SECOND, MAX_PER_SECOND),
        ("1000000/s", MAX_PER_SECOND),
        ("1/d", 1 / 86400),
    ],
)
def test_every_form_of_rate_parses_to_starts_per_second(given: Any, per_second: float) -> None:
    parsed = rate(given, "rate of x")
    assert parsed.per_second == pytest.approx(per_second, rel=1e-12)
    assert parsed.burst == 1
    assert parsed.interval == pytest.approx(1 / per_second, rel=1e-12)
    assert parsed.interval_us == pytest.approx(1_000_000 / per_second, rel=1e-12)


def test_a_rate_keeps_its_text_for_messages() -> None:
    assert str(rate(" 100/m ", "x")) == "100/m"
    assert str(rate(2.5, "x")) == "2.5/s"
    assert str(rate(10, "x")) == "10/s"
    assert str(Rate(4.0)) == "4/s"


def test_a_parsed_rate_passes_through_unchanged() -> None:
    parsed = rate("10/s", "x", burst=3)
    assert rate(parsed, "y") is parsed


@pytest.mark.parametrize(
    "bad",
    [
        "5/x",
        "5/S",  # Celery's units are lower case
        "5/sec",
        "5/",
        "/s",
        "",
        "  ",
        "ten/s",
        "5/s/m",
        "0/s",
        "0",
        "-5/s",
        "-1",
        "nan/s",
        "inf/s",
        "0x10/s",
        0,
        0.0,
        -1,
        -0.5,
        True,
        False,
        math.nan,
        math.inf,
        -math.inf,
        None,
        [10],
        b"10/s",
    ],
)
def test_a_bad_rate_is_refused_naming_the_value(bad: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        rate(bad, "rate of rate limit 'api'")
    message = str(caught.value)
    assert "rate of rate limit 'api'" in message
    assert repr(bad) in message


@pytest.mark.parametrize("too_fast", [MAX_PER_SECOND * 2, "2000000/s", "120000001/m"])
def test_a_rate_faster_than_one_start_a_microsecond_is_refused(too_fast: Any) -> None:
    with pytest.raises(ConfigurationError, match="at most 1e\\+06 starts a second") as caught:
        rate(too_fast, "rate of x")
    assert repr(too_fast) in str(caught.value)


@pytest.mark.parametrize("too_slow", [MIN_PER_SECOND / 2, 1e-300, "0.001/d", "1e-9"])
def test_a_rate_slower_than_one_start_a_year_is_refused(too_slow: Any) -> None:
    """Slower rates would overflow the script's expiry (Redis refuses the SET)."""
    with pytest.raises(ConfigurationError, match="at least one start a year") as caught:
        rate(too_slow, "rate of x")
    assert repr(too_slow) in str(caught.value)
    assert rate(MIN_PER_SECOND, "x").per_second == MIN_PER_SECOND  # the bound itself is fine


@pytest.mark.parametrize("burst", [1, 2, 50, 10_000])
def test_burst_is_a_whole_number_of_starts(burst: int) -> None:
    parsed = rate("10/s", "x", burst=burst)
    assert parsed.burst == burst
    assert parsed.per_second == 10.0


@pytest.mark.parametrize("bad", [0, -1, -5, 1.5, 2.0, "2", True, False, None, math.nan])
def test_a_bad_burst_is_refused_naming_the_value(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="burst") as caught:
        rate("10/s", "rate of rate limit 'api'", burst=bad)
    assert "rate of rate limit 'api'" in str(caught.value)
    assert repr(bad) in str(caught.value)


@pytest.mark.parametrize("limiter", [RateLimiter, aio.RateLimiter])
def test_the_limiters_refuse_bad_input_at_construction_naming_the_limit(limiter: Any) -> None:
    client = object()  # never used: construction talks to no server
    with pytest.raises(ConfigurationError, match=r"'api'.*'5/x'"):
        limiter(client, "api", "5/x")
    with pytest.raises(ConfigurationError, match=r"'api'.*burst.*-1"):
        limiter(client, "api", "5/s", burst=-1)
    with pytest.raises(ConfigurationError, match=r"'api'.*0"):
        limiter(client, "api", 0)
    with pytest.raises(ConfigurationError, match="name"):
        limiter(client, "", "5/s")
    with pytest.raises(ConfigurationError, match="braces"):
        limiter(client, "api", "5/s", prefix="a{b}")
    good = limiter(client, "api", "5/s", burst=2, prefix="p")
    assert good.key == keys.rate_key("p", "api") == "p:{api}:rate"
    assert good.rate == Rate(5.0, 2, "5/s")
    assert "'api'" in repr(good) and "5/s" in repr(good) and "burst=2" in repr(good)


@pytest.mark.parametrize("limiter", [RateLimiter, aio.RateLimiter])
def test_a_rate_key_shares_the_hash_tag_of_a_lock_of_the_same_name(limiter: Any) -> None:
    key = limiter(object(), "api", "5/s").key
    assert key == "redislock:{api}:rate"
    assert key.startswith(keys.tag("redislock", "api") + ":")
    braces = limiter(object(), "a{b}c", "5/s").key  # digested inside the tag
    assert braces.count("{") == 1 and braces.endswith("}:rate")


# -- the script call and its reply ---------------------------------------------


def test_slot_call_carries_interval_burst_and_how_far_ahead_in_microseconds() -> None:
    limit = rate("4/s", "x", burst=3)
    now_only = slot_call("p:{a}:rate", limit, 0.0)
    assert now_only.script == "rate_acquire"
    assert now_only.keys == ["p:{a}:rate"]
    assert now_only.args == ["250000.0", 3, 0]
    assert slot_call("p:{a}:rate", limit, None).args[2] == -1  # however far
    assert slot_call("p:{a}:rate", limit, 1.5).args[2] == 1_500_000
    assert slot_call("p:{a}:rate", limit, 0.0000015).args[2] == 1  # floored: never further
    assert slot_call("p:{a}:rate", limit, -3.0).args[2] == 0


def test_slot_call_interval_round_trips_through_text_exactly() -> None:
    for given in ["3/s", "7/m", "1/d", 1e-7, MAX_PER_SECOND]:
        limit = rate(given, "x")
        sent = slot_call("k", limit, None).args[0]
        assert float(sent) == limit.interval_us


@pytest.mark.parametrize(
    ("reply", "slot"),
    [
        ([1, 0], Slot(True, 0.0)),
        ([1, 250000], Slot(True, 0.25)),
        ([0, 1], Slot(False, 0.000001)),
        ([0, 3_000_000], Slot(False, 3.0)),
        ([b"1", b"12"], Slot(True, 0.000012)),  # a reply read as bytes
    ],
)
def test_parse_slot_reads_taken_and_the_delay_in_seconds(reply: list[Any], slot: Slot) -> None:
    parsed = parse_slot(reply)
    assert parsed == slot
    assert isinstance(parsed.taken, bool)
