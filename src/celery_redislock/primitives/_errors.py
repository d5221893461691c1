"""What a failed Redis call becomes: BackendUnavailable or BackendUnsupported.

Every call of the primitives goes through :func:`run`, so "cannot reach
Redis" and "this Redis is too old for our scripts" read the same wherever
they happen, naming the operation and the key.
"""

from __future__ import annotations

from typing import Any, Optional

from redis.exceptions import ResponseError

from .. import transport
from . import scripts
from .failures import too_old, unreachable

__all__ = ["guard", "run", "too_old", "unreachable"]


def run(
    client: Any,
    op: str,
    key: str,
    script: str,
    block: transport.KeyBlock,
    args: list[Any],
    *,
    sends: Optional[list[int]] = None,
    deadline: Optional[float] = None,
    replicas: Optional[tuple[int, int]] = None,
    packed: Any = None,
) -> Any:
    """Run script ``script`` on ``block``'s keys: one round trip.  With
    ``replicas``, the reply is ``(reply, replicas that acknowledged)``;
    ``packed``, when given, is the call already packed."""
    try:
        return transport.call(
            client,
            scripts.get(script),
            block,
            args,
            packed=packed,
            sends=sends,
            deadline=deadline,
            replicas=replicas,
        )
    except transport.UNREACHABLE as exc:
        raise unreachable(op, key, exc) from exc
    except ResponseError as exc:
        if transport.refused_as_too_old(exc):
            raise too_old(op, key, exc) from exc
        raise


def guard(op: str, key: str, fn: Any, *args: Any) -> Any:
    """A plain redis-py command, with "cannot reach Redis" as BackendUnavailable."""
    try:
        return fn(*args)
    except transport.UNREACHABLE as exc:
        raise unreachable(op, key, exc) from exc
