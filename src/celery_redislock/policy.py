"""Pure decisions of the task integration: owner tokens, backoff, effective policy."""

from __future__ import annotations

import random
from typing import Optional

__all__ = ["RETRIES_HEADER", "backoff", "effective_policy", "holder_task_id", "owner_prefix"]

#: Message header counting contention retries (separate from Celery's ``retries``,
#: so contention never consumes the task's own ``max_retries``).
RETRIES_HEADER = "redislock_retries"
_SEP = "|"


def owner_prefix(task_id: str, hostname: Optional[str], pid: int) -> str:
    """The owner-token prefix of one task run: task id, worker hostname and pid.

    The worker's main process rebuilds it from its own Request to reap the
    lock of a child it killed (hard time limit, revoke with terminate).
    """
    return f"{task_id}{_SEP}{hostname or ''}{_SEP}{pid}{_SEP}"


def holder_task_id(token: Optional[str]) -> Optional[str]:
    """The task id inside an owner token (or the whole token of a non-task holder)."""
    if token is None:
        return None
    return token.split(_SEP, 1)[0] if _SEP in token else token


def backoff(attempt: int, base: float, cap: float, rand: Optional[random.Random] = None) -> float:
    """Delay before contention retry number ``attempt`` (0-based), in seconds.

    Exponential (``base * 2**attempt``), capped at ``cap``, with "equal
    jitter": uniformly between half and all of it, so duplicates that collided
    once spread out instead of colliding again.
    """
    ceiling = float(min(cap, base * 2.0 ** min(attempt, 62)))
    r: float = (rand or random).random()
    return ceiling / 2 + r * ceiling / 2


def effective_policy(policy: str, is_eager: bool) -> str:
    """The policy that applies to one run.

    Eager runs (``apply()``, ``task_always_eager``) have no broker to re-send
    to, so ``retry`` waits instead.
    """
    if is_eager and policy == "retry":
        return "wait"
    return policy
