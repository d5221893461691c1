"""Who is told when a held lease is found lost, by either driver.

The sync keeper (``_keeper.py``) and the asyncio renewal tasks
(``celery_redislock.asyncio.renewal``) call :func:`notify_lost`; the Celery
side registers a listener that sends the ``lock_lost`` signal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "ERROR_RETRY",
    "add_lost_listener",
    "logger",
    "notify_lost",
    "remove_lost_listener",
    "retry_soon",
]

logger = logging.getLogger("celery_redislock.renewal")

#: How soon a lease is renewed again after a failed renewal, in seconds.
ERROR_RETRY = 1.0

_listeners: list[Callable[[Any, str], None]] = []


def add_lost_listener(fn: Callable[[Any, str], None]) -> None:
    """Call ``fn(lease, reason)`` whenever a held lease is found lost (idempotent)."""
    if fn not in _listeners:
        _listeners.append(fn)


def remove_lost_listener(fn: Callable[[Any, str], None]) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def notify_lost(lease: Any, reason: str) -> None:
    """Log that ``lease`` was lost, and tell every listener."""
    logger.warning("lock %s lost: %s", lease.key, reason)
    for fn in list(_listeners):
        try:
            fn(lease, reason)
        except Exception:  # a listener must not stop renewal
            logger.exception("lock_lost listener %r failed", fn)


def retry_soon(failed: list[tuple[Any, BaseException]]) -> None:
    """Log renewals that failed (entry, error), and make each due again within
    :data:`ERROR_RETRY` (or its own interval, when shorter)."""
    if not failed:
        return
    logger.error(
        "cannot renew %d lease(s), retrying in %g s: %r", len(failed), ERROR_RETRY, failed[0][1]
    )
    now = time.monotonic()
    for entry, _ in failed:
        entry.next_due = now + min(ERROR_RETRY, entry.interval)
