"""The lock protocol without I/O: what each script call sends, and what its reply means.

Every operation of a Lock, a Semaphore or a side of a ReadWriteLock is one
call of a Lua script (``lua/``) on the primitive's keys (:mod:`.keys`).  This
module builds those calls, as a script name, keys and arguments, and parses
their replies into named results.  It holds no socket, no thread and no
clock, and knows nothing of Celery: the sync primitives (:mod:`._core` and the
modules built on it) and
the asyncio ones (:mod:`celery_redislock.asyncio`) are two drivers of it,
sending the same calls to the same keys, so they share names, fences and
queues, and hand over to each other.

Its replies parse into the named results of :mod:`.results`: ``Granted``,
``Queued``, ``Duplicate``, ``Superseded``, ``OverRate``, ``Released`` and
``Recovered``, each with the parked runs the call granted (``handoffs``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Protocol, Union

from .keys import LockKeys, MultiKeys
from .kinds import Kind, Mode, Scripts
from .results import (
    AcquireResult,
    Duplicate,
    Granted,
    Handoff,
    OverRate,
    Queued,
    Recovered,
    Released,
    Superseded,
)

__all__ = [
    "DEFAULT_RESERVE_MS",
    "FOREVER_MS",
    "GRACE_MS",
    "AcquireResult",
    "Call",
    "Duplicate",
    "Granted",
    "Handoff",
    "Kind",
    "Mode",
    "OverRate",
    "Queued",
    "Recovered",
    "Released",
    "Scripts",
    "Superseded",
    "acquire",
    "acquire_args",
    "cancel",
    "decode",
    "extend",
    "lead_key",
    "lease_keys",
    "lease_start",
    "park_drop",
    "parse_acquire",
    "parse_extend",
    "parse_park_drop",
    "parse_recover",
    "parse_release",
    "parse_retoken",
    "parse_wake",
    "recover",
    "release",
    "release_args",
    "retoken",
    "script_keys",
    "to_ms",
]

#: A waiter's place in line is dropped this long after it should have woken.
GRACE_MS = 2000
#: "Wait forever", as sent to the scripts (they compare milliseconds).
FOREVER_MS = 2**40
#: How long a parked entry granted by a script call may take to claim its grant.
DEFAULT_RESERVE_MS = 10000

Keys = Union[LockKeys, MultiKeys]


class Claim(Protocol):
    """A unique job's claim carried by a run's acquire and release (see unique.py)."""

    @property
    def key(self) -> str: ...

    def arg(self) -> str: ...


class Start(Protocol):
    """A start under a rate limit carried by a run's acquire (see rates.py):
    taken only with the lock."""

    @property
    def key(self) -> str: ...
    def arg(self) -> str: ...


class Call(NamedTuple):
    """One script call: the script's name, its keys and its arguments."""

    script: str
    keys: list[str]
    args: list[Any]


# -- helpers -----------------------------------------------------------------------


def to_ms(seconds: float) -> int:
    """Seconds as the scripts' whole milliseconds, at least 1."""
    return max(1, int(seconds * 1000))


def decode(value: Any) -> str:
    """A reply item as text."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def handoffs(items: Any) -> list[Handoff]:
    """The (token, payload) pairs at the end of a reply."""
    if not items:
        return []
    return [(decode(items[i]), items[i + 1]) for i in range(0, len(items) - 1, 2)]


def script_keys(
    keys: Keys, claim: Optional[Claim] = None, start: Optional[Start] = None
) -> list[str]:
    """The keys of every acquire, release and cancel call of a primitive (an
    acquire carrying a ``start`` has its rate key too)."""
    found = list(keys.script_keys)
    if start is not None:
        found.append(start.key)
    if claim is not None:
        found.append(claim.key)
    return found


def lease_keys(keys: Keys) -> list[str]:
    """The keys of the renewal call (the lease lives in the first)."""
    if isinstance(keys, LockKeys):
        return [keys.lock]
    return [keys.holders, keys.info]


# -- calls -------------------------------------------------------------------------


def acquire_args(
    keys: Keys,
    token: str,
    lease_ms: int,
    wait_ms: int,
    keep_ms: int,
    *,
    mode: Optional[Mode] = None,
    limit: int = 0,
    payload: bytes | str = "",
    reserve_ms: int = DEFAULT_RESERVE_MS,
    parked_run: bool = False,
    order_ms: Optional[float] = None,
    claim: Optional[Claim] = None,
    start: Optional[Start] = None,
) -> list[Any]:
    """The arguments of an acquire call: take it now or queue ``token``
    (``wait_ms`` 0: do not queue); park ``payload`` instead when given.
    ``mode`` and ``limit`` for a semaphore or a side of a read-write lock;
    ``start``: take a start under a rate limit with it (a call that does not wait)."""
    args: list[Any] = [token, lease_ms, wait_ms, keys.wake, GRACE_MS, keep_ms]
    if payload or parked_run or mode is not None or claim is not None or start is not None:
        # Left out when not parking (the common, hot path): the script defaults them.
        args += [
            payload,
            reserve_ms,
            1 if parked_run else 0,
            "" if order_ms is None else order_ms,
        ]
        if mode is not None:
            args += [mode.value, limit]
        if start is not None:
            args.append(start.arg())
        if claim is not None:
            args.append(claim.arg())
    return args


def acquire(kind: Kind, keys: Keys, token: str, *args: Any, **options: Any) -> Call:
    """The acquire call (arguments: :func:`acquire_args`)."""
    claim = options.get("claim")
    return Call(
        kind.scripts.acquire,
        script_keys(keys, claim, options.get("start")),
        acquire_args(keys, token, *args, **options),
    )


def release_args(
    keys: Keys,
    token: str,
    keep_ms: int,
    *,
    reserve_ms: int = DEFAULT_RESERVE_MS,
    claim: Optional[Claim] = None,
    prefix_match: bool = False,
) -> list[Any]:
    """The arguments of a release of ``token``'s hold (with ``prefix_match``,
    of every token it starts: a supervisor reaping a dead child's holds)."""
    if claim is not None:
        return [token, keys.wake, keep_ms, 1 if prefix_match else 0, reserve_ms, claim.arg()]
    if reserve_ms == DEFAULT_RESERVE_MS and not prefix_match:
        return [token, keys.wake, keep_ms]
    return [token, keys.wake, keep_ms, 1 if prefix_match else 0, reserve_ms]


def release(kind: Kind, keys: Keys, token: str, keep_ms: int, **options: Any) -> Call:
    """The release call (arguments: :func:`release_args`)."""
    return Call(
        kind.scripts.release,
        script_keys(keys, options.get("claim")),
        release_args(keys, token, keep_ms, **options),
    )


def cancel(
    kind: Kind, keys: Keys, token: str, keep_ms: int, reserve_ms: int = DEFAULT_RESERVE_MS
) -> Call:
    """A waiter gives up its place; its reply parses with :func:`parse_acquire`
    (Granted when a release granted it just before)."""
    return Call(kind.scripts.cancel, script_keys(keys), [token, keys.wake, reserve_ms, keep_ms])


def extend(kind: Kind, keys: Keys, token: str, lease_ms: int) -> Call:
    """Renew ``token``'s lease to ``lease_ms`` from now; the reply is 1 or 0."""
    return Call(kind.scripts.extend, lease_keys(keys), [token, lease_ms])


def recover(kind: Kind, keys: Keys, keep_ms: int, reserve_ms: int = DEFAULT_RESERVE_MS) -> Call:
    """Re-grant the parked runs nobody else would wake; reply: :func:`parse_recover`."""
    return Call(kind.scripts.recover, script_keys(keys), [keys.wake, reserve_ms, keep_ms])


def park_drop(keys: Keys, token: str) -> Call:
    """Take parked run ``token`` out of line; reply: :func:`parse_park_drop`."""
    return Call("park_drop", [keys.queue, keys.meta, keys.pmsg, keys.inflight], [token])


def retoken(kind: Kind, keys: Keys, old: str, new: str) -> Call:
    """Move a hold from token ``old`` to ``new``; the reply is 1, or 0 when
    ``old`` held nothing any more."""
    return Call("retoken", script_keys(keys), [old, new, "m" if kind.multi else ""])


def count_holders(keys: MultiKeys) -> Call:
    """How many holders of a semaphore or read-write lock have a live lease;
    the reply is that number."""
    return Call("multi_count", [keys.holders], [])


def owned(keys: MultiKeys, token: str) -> Call:
    """Whether ``token`` holds a live permit or side (its entry's score is
    when its lease ends); the reply is 1 or 0."""
    return Call("multi_owned", [keys.holders], [token])


# -- replies -----------------------------------------------------------------------


def parse_acquire(reply: Any) -> AcquireResult:
    """The outcome of an acquire (or cancel) call."""
    if isinstance(reply, int):  # held, nothing to hand over: the bare fence
        return Granted(reply, [])
    status = int(reply[0])
    granted = handoffs(reply[4:])
    if status == 1:
        return Granted(int(reply[1]), granted)
    if status == 0:
        return Queued(decode(reply[2]), int(reply[1]), int(reply[3]), granted)
    if status == -1:
        return Duplicate(granted)
    if status == -2:
        return Superseded(decode(reply[2]), granted)
    if status == -3:
        return OverRate(int(reply[1]) / 1_000_000.0, granted)
    raise ValueError(f"unknown acquire reply status {status!r}")


def parse_release(reply: Any) -> Released:
    if isinstance(reply, int):
        return Released(bool(reply), [])
    return Released(bool(int(reply[0])), handoffs(reply[2:]))


def parse_extend(reply: Any) -> bool:
    """Whether a renewal found the lease still held (and renewed it)."""
    return bool(int(reply))


def parse_retoken(reply: Any) -> bool:
    """Whether a retoken found the old token still holding (and moved the hold)."""
    return bool(int(reply))


def parse_recover(reply: Any) -> Recovered:
    return Recovered(int(reply[0]), handoffs(reply[1:]))


def parse_park_drop(reply: Any) -> Optional[tuple[bytes, bool]]:
    """(payload, whether it had been granted: held under its token), or None
    when the token was not parked there."""
    if not reply:
        return None
    return reply[0], bool(int(reply[1]))


def parse_wake(popped: bytes) -> tuple[int, Optional[int]]:
    """A wake-up pushed by a release: (fence, server ms of the grant or None)."""
    fence, _, granted_ms = popped.partition(b":")
    return int(fence), int(granted_ms) if granted_ms else None


def lease_start(sent: float, server_ms: int, granted_ms: Optional[int]) -> float:
    """The local time a handed-over lease began, at the earliest.

    ``sent`` is the local time the waiter's last acquire call was sent and
    ``server_ms`` the server's clock in its reply.  The server read its clock
    after that send, so the send time moved by the server time that passed
    between that call and the grant is never later than the grant: the local
    lease never outlasts the server's.
    """
    if granted_ms is None:
        return sent
    return sent + (granted_ms - server_ms) / 1000.0


def lead_key(keys: Keys) -> str:
    """The key that exists while the primitive is held (where its lease lives)."""
    return keys.lock if isinstance(keys, LockKeys) else keys.holders
