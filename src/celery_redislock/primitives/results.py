"""What the lock protocol's script replies mean: one named result per outcome.

:mod:`.protocol` parses each reply into one of these; the drivers (sync and
asyncio) act on them, never on a reply's positions.  Every result of a call
that can serve the queue carries ``handoffs``: the parked runs (token,
payload) that call granted, for their parker to re-publish.
"""

from __future__ import annotations

from typing import NamedTuple, Union

__all__ = [
    "AcquireResult",
    "Duplicate",
    "Granted",
    "Handoff",
    "OverRate",
    "Queued",
    "Recovered",
    "Released",
    "Superseded",
]

#: (token, payload) of a parked entry that a script call granted.
Handoff = tuple[str, bytes]


class Granted(NamedTuple):
    """Held: ``fence`` is the fencing token of this grant."""

    fence: int
    handoffs: list[Handoff]


class Queued(NamedTuple):
    """Not held: in line (or parked) behind ``holder``, whose lease has
    ``holder_ttl_ms`` left; ``server_ms`` is the server's clock at the call."""

    holder: str
    holder_ttl_ms: int
    server_ms: int
    handoffs: list[Handoff]


class Duplicate(NamedTuple):
    """A parked run's second delivery: its token had already claimed the grant."""

    handoffs: list[Handoff]


class Superseded(NamedTuple):
    """A unique job that a newer publish replaced (by job ``by``): refused."""

    by: str
    handoffs: list[Handoff]


class OverRate(NamedTuple):
    """No start free under the carried rate limit for ``delay`` seconds:
    nothing was taken, queued or parked."""

    delay: float
    handoffs: list[Handoff]


AcquireResult = Union[Granted, Queued, Duplicate, Superseded, OverRate]


class Released(NamedTuple):
    """``held``: the caller held it and released it; else its lease had run out."""

    held: bool
    handoffs: list[Handoff]


class Recovered(NamedTuple):
    """A recovery sweep: when (server ms) to sweep again, -1 when nothing is parked."""

    next_check_ms: int
    handoffs: list[Handoff]
