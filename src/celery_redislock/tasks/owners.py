"""Who holds a lock: the owner-token prefix of a task run, and reading it back.

A task run's owner token is ``task_id|hostname|pid|task_name|`` then the
random part (:func:`celery_redislock.primitives.tokens.new_token`), so the
holder of any lock, semaphore permit or read-write side can be named (task,
worker, pid) from the token alone: no field is written for it, and taking a
lock costs no more.  The worker's main process rebuilds the same prefix to
free the locks of a child it killed.  A parked run waits under the token of
the run that parked it; re-published, its run takes a token of its own.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

__all__ = ["Owner", "holder_task_id", "owner_prefix", "parse_owner"]

_SEP = "|"


class Owner(NamedTuple):
    """What a holder's token says of it; None where it does not say."""

    task_id: Optional[str]
    task_name: Optional[str]
    hostname: Optional[str]  # the worker's node name, as in request.hostname
    pid: Optional[int]


def owner_prefix(task_id: str, hostname: Optional[str], pid: int, task_name: str = "") -> str:
    """The owner-token prefix of one task run: task id, worker hostname, pid, task name."""
    return f"{task_id}{_SEP}{hostname or ''}{_SEP}{pid}{_SEP}{task_name}{_SEP}"


def holder_task_id(token: Optional[str]) -> Optional[str]:
    """The task id inside an owner token (or the whole token of a non-task holder)."""
    if token is None:
        return None
    return token.split(_SEP, 1)[0] if _SEP in token else token


def parse_owner(token: str) -> Owner:
    """Read a holder's token: a task run's (see the module docstring), or any
    other holder's, which names nothing (its token is shown as it is)."""
    parts = token.split(_SEP)
    if len(parts) < 4 or not parts[2].isdigit():
        return Owner(None, None, None, None)
    task_id, host, pid = parts[0], parts[1], int(parts[2])
    # Without a task name (id|host|pid|random): a token of an earlier release.
    name = _SEP.join(parts[3:-1]) or None if len(parts) > 4 else None
    return Owner(task_id, name, host or None, pid)
