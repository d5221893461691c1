"""Rates: how many starts per period, parsed once, and the slot calls of the
generic cell rate algorithm (``lua/rate_acquire.lua``), sans I/O.

A rate is Celery's rate string (``"10/s"``, ``"100/m"``, ``"1000/h"``, or
``"10"``: so many a second) or a number of permits per second.  A
:class:`Rate` spaces starts one ``interval`` apart; ``burst`` starts may come
at once, so in any period of a second at most ``per_second + burst`` start
(``burst=1``: the steady spacing alone, one more only at the window's very
edge).  The state is one key per limit, holding the theoretical arrival
time of the next start on the server's clock; it expires as soon as nothing
is owed.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

from .. import _validate
from ..exceptions import ConfigurationError
from . import keys
from .protocol import Call

__all__ = [
    "MAX_PER_SECOND",
    "MIN_PER_SECOND",
    "PERIODS",
    "Rate",
    "Slot",
    "Start",
    "parse_slot",
    "rate",
    "slot_call",
]

#: Seconds in each period a rate string may name.
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: The fastest rate: one start per microsecond, the script's resolution.
MAX_PER_SECOND = 1_000_000.0
#: The slowest rate: one start a year.  Slower ones would push the script's
#: times past what a double holds exactly, and its expiry past what Redis takes.
MIN_PER_SECOND = 1.0 / (365 * 86400.0)


class Rate(NamedTuple):
    """A parsed rate: ``per_second`` starts a second, ``burst`` at once."""

    per_second: float
    burst: int = 1
    #: As the user wrote it, for messages.
    text: str = ""

    @property
    def interval(self) -> float:
        """Seconds between two steady starts."""
        return 1.0 / self.per_second

    @property
    def interval_us(self) -> float:
        return 1_000_000.0 / self.per_second

    def __str__(self) -> str:
        return self.text or f"{self.per_second:g}/s"


def rate(value: Any, what: str, burst: Any = 1) -> Rate:
    """Parse ``value`` (``"N/s"``, ``"N/m"``, ``"N/h"``, ``"N/d"``, ``"N"`` or a
    number of permits per second) and ``burst``; ``what`` names them in the error."""
    if isinstance(value, Rate):
        return value
    per_second = _per_second(value, what)
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ConfigurationError(
            f"{what}: burst must be a whole number of starts, at least 1, got {burst!r}"
        )
    text = value.strip() if isinstance(value, str) else f"{value:g}/s"
    return Rate(per_second, burst, text)


def _per_second(value: Any, what: str) -> float:
    expected = (
        "a rate such as '10/s', '100/m', '1000/h' or '5/d', or a number of permits per "
        f"second above 0, got {value!r}"
    )
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be {expected}")
    if isinstance(value, (int, float)):
        number, period = float(value), 1.0
    elif isinstance(value, str) and value.count("/") <= 1:
        # Celery reads a bare number ("10") as so many a second.
        count, slash, unit = (part.strip() for part in value.partition("/"))
        unit = unit if slash else "s"
        if unit not in PERIODS:
            raise ConfigurationError(f"{what} must be {expected}")
        try:
            number, period = float(count), PERIODS[unit]
        except ValueError:
            raise ConfigurationError(f"{what} must be {expected}") from None
    else:
        raise ConfigurationError(f"{what} must be {expected}")
    if not (math.isfinite(number) and number > 0):
        raise ConfigurationError(f"{what} must be {expected}")
    per_second = number / period
    if per_second > MAX_PER_SECOND:
        raise ConfigurationError(
            f"{what}: at most {MAX_PER_SECOND:g} starts a second, got {value!r}"
        )
    if per_second < MIN_PER_SECOND:
        raise ConfigurationError(f"{what}: at least one start a year, got {value!r}")
    return per_second


class Start(NamedTuple):
    """A start under ``limit`` at ``key``, carried by a lock's acquire call
    (:data:`celery_redislock.primitives.protocol.Start`): taken only with the lock."""

    key: str
    limit: Rate

    def arg(self) -> str:
        return f"rate:{self.limit.interval_us!r}:{self.limit.burst}"


class Slot(NamedTuple):
    """A rate script's answer: whether the slot is the caller's, and in how
    many seconds it comes (the next free one's, when not taken)."""

    taken: bool
    delay: float


def slot_call(key: str, limit: Rate, ahead: float | None) -> Call:
    """Take the next slot of ``key`` at most ``ahead`` seconds away (0: now
    only; None: however far)."""
    ahead_us = -1 if ahead is None else max(0, math.floor(ahead * 1_000_000))
    return Call("rate_acquire", [key], [repr(limit.interval_us), limit.burst, ahead_us])


def parse_slot(reply: Any) -> Slot:
    """The :class:`Slot` of a ``rate_acquire`` reply ``{taken, delay µs}``."""
    return Slot(int(reply[0]) == 1, int(reply[1]) / 1_000_000.0)


_rate = rate  # (LimitState's argument of that name hides it)


class LimitState:
    """What the sync and asyncio RateLimiter share: the checked name, rate and
    key, and the check of an acquire's arguments."""

    noun = "rate limit"

    def __init__(
        self, client: Any, name: str, rate: Any, burst: int = 1, *, prefix: str = "redislock"
    ) -> None:
        what = f"rate limit {name!r}"
        _validate.check_name(name, f"name of {what}")
        _validate.check_name(prefix, f"prefix of {what}")
        self.client = client
        self.name = name
        self.limit: Rate = _rate(rate, f"rate of {what}", burst)
        self.key = keys.rate_key(prefix, name)

    @property
    def rate(self) -> Rate:
        return self.limit

    def within(self, blocking: bool, timeout: Optional[float]) -> Optional[float]:
        """How far ahead an acquire may take its start (see :func:`slot_call`)."""
        if timeout is not None:
            if not blocking:
                raise ValueError("can't specify a timeout for a non-blocking acquire")
            _validate.check_seconds(timeout, f"timeout of {self.noun} {self.name!r}")
        return timeout if blocking else 0.0
