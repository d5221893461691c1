"""LockedRequest: the worker main process frees the lock of a child it killed.

A hard time limit or ``revoke(terminate=True)`` kills the pool child with
SIGKILL/SIGTERM, so no ``finally`` runs there and the lock would stay until
its lease ends.  The main process sees both (``on_timeout``, ``on_failure``
with WorkerLostError/Terminated), waits until the child is really dead (the
hard-timeout handler runs before the kill), and releases the lock if its owner
token still carries that child's prefix (task id, hostname, pid): it never
touches a lock someone else took since.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any, Optional

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from .. import config
from ..primitives import Kind, keys, reap, unique
from ..primitives.protocol import lead_key
from ..unique.run import claim_in
from .owners import owner_prefix
from .parking import PARK_HEADER

__all__ = ["LockedRequest", "wait_dead"]

logger = logging.getLogger("celery_redislock")

#: How long the main process waits for a killed child to be gone before reaping.
DEATH_TIMEOUT = 10.0

_KILLED = (Terminated, TimeLimitExceeded, WorkerLostError, SystemExit)


def wait_dead(pid: int, timeout: float = DEATH_TIMEOUT) -> bool:
    """Wait until process ``pid`` has exited (a zombie counts); True if it did."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            if state in (b"Z", b"X"):
                return True
        except FileNotFoundError:
            return True
        except (OSError, IndexError):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


class LockedRequest(Request):  # type: ignore[misc]
    """The Request class of LockedTask (``Task.Request``), used in the main process."""

    _redislock_reaped = False
    _redislock_dropped = False

    def revoked(self) -> bool:
        # A revoked (or expired) message is discarded here, in the main
        # process, and never runs: a unique job's key goes with it.
        found: bool = super().revoked()
        if found and not self._redislock_dropped:
            self._redislock_dropped = True
            claim = claim_in(self._request_dict, self.id, False)
            if claim is not None:
                threading.Thread(
                    target=_drop, args=(self.task.app, claim), daemon=True, name="redislock-drop"
                ).start()
        return found

    def terminate(self, pool: Any, signal: Any = None) -> None:
        # revoke(terminate=True): reap as soon as the child is dead, rather
        # than when billiard next notices the lost worker (up to seconds).
        super().terminate(pool, signal)
        if self.time_start and self.worker_pid:
            self._redislock_reap("revoke(terminate=True)")

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft:
            self._redislock_reap("hard time limit")

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info.exception, "exc", exc_info.exception)
        if isinstance(exc, _KILLED):
            self._redislock_reap(type(exc).__name__)
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )

    def _redislock_reap(self, why: str) -> None:
        if self._redislock_reaped or not self.worker_pid:
            return
        self._redislock_reaped = True
        task, pid = self.task, self.worker_pid
        try:
            name, kind = task.lock_target_for(self.args, self.kwargs)
        except Exception:
            logger.exception("%s[%s]: cannot compute the lock to reap", self.task_name, self.id)
            return
        # A re-published parked run holds under the token it parked with until
        # it takes its own (entry._retoken): either may hold.
        headers = self._request_dict
        parked = headers.get(PARK_HEADER) or (headers.get("headers") or {}).get(PARK_HEADER)
        owners = (owner_prefix(self.id, self.hostname, pid, task.name), *filter(None, [parked]))
        # The dead run's job ends with it, unless its message goes back to the
        # queue (acks_late with task_reject_on_worker_lost): it then waits
        # again, with its unique key.
        requeued = bool(
            task.acks_late and why == "WorkerLostError" and task.app.conf.task_reject_on_worker_lost
        )
        claim = claim_in(headers, self.id, bool(task.acks_late))
        if claim is not None and requeued:
            claim = dataclasses.replace(claim, waits_again=True)
        threading.Thread(
            target=_reap,
            args=(task.app, name, kind, owners, pid, why, self.id, claim),
            daemon=True,
            name="redislock-reap",
        ).start()


def _drop(app: Any, claim: unique.Claim) -> None:
    try:
        unique.drop(config.client_for(app), claim.key, claim.job)
    except Exception:
        logger.exception("could not free unique key %s of revoked task %s", claim.key, claim.job)


def _reap(
    app: Any,
    name: str,
    kind: Kind,
    owners: tuple[str, ...],
    pid: int,
    why: str,
    task_id: str,
    claim: Optional[unique.Claim] = None,
) -> None:
    if not wait_dead(pid):
        logger.warning(
            "child %d of task %s is still alive; its lease will expire instead", pid, task_id
        )
        return
    try:
        settings = config.settings_for(app)
        client = config.client_for(app)
        folded = claim is not None and unique.foldable(
            client, claim.key, _lock_key(settings.key_prefix, name, kind)
        )
        freed = False
        for owner in owners:
            freed = reap(
                client,
                name,
                owner,
                prefix=settings.key_prefix,
                kind=kind,
                fence_retention=settings.fence_retention,
                claim=claim if folded else None,
            )
            if freed:
                break
        if claim is not None and not folded:
            unique.claim_step(client, claim, "end")
    except Exception:
        logger.exception("could not free lock %r of task %s (%s)", name, task_id, why)
        return
    if freed:
        logger.warning("freed lock %r of task %s, killed by %s", name, task_id, why)


def _lock_key(prefix: str, name: str, kind: Kind) -> str:
    """The key holding the lease of primitive ``name`` (for its hash slot)."""
    return lead_key(keys.of_kind(kind, prefix, name))
