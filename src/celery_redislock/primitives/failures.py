"""What a failed Redis call of a primitive becomes, in either driver:
BackendUnavailable or BackendUnsupported, naming the operation and the key."""

from __future__ import annotations

from ..exceptions import BackendUnavailable, BackendUnsupported

__all__ = ["too_old", "unreachable"]


def unreachable(op: str, key: str, exc: BaseException) -> BackendUnavailable:
    """Redis could not be reached during ``op`` on ``key``."""
    error = BackendUnavailable(f"Redis unreachable during {op} of {key!r}: {exc}")
    error.__cause__ = exc
    return error


def too_old(op: str, key: str, exc: BaseException) -> BackendUnsupported:
    """Redis refused a script as a server before 6.2 does."""
    error = BackendUnsupported(
        f"Redis refused the {op} script of {key!r} as a syntax error, as a server before "
        f"Redis 6.2 refuses its SET ... GET: celery_redislock needs Redis 6.2 or later ({exc})"
    )
    error.__cause__ = exc
    return error
