"""``PARKED``: the result state of a run whose message waits in its lock's line.

Without it a parked run is PENDING, which a caller cannot tell from an unknown
task id.  Its meta (``AsyncResult.info``) names what it waits for:
``{"kind": "lock", "name": ..., "holder": ...}`` (kind ``"semaphore"``,
``"read lock"`` or ``"write lock"`` for the others; holder: the task id that
held it when the run parked).  PARKED is not a ready state: ``get()`` waits
through it for the run's outcome.

It is written after the park script call, so the re-published run may already
have stored a state of its own (STARTED, RETRY, even SUCCESS or FAILURE) on
another worker.  PARKED therefore replaces only nothing (PENDING) or the
STARTED this run's own tracer stored (``task_track_started``); any other state
stays (a run that parks after a retry shows RETRY until it runs).  That takes a
compare-and-set, a script on the result store, so only Celery's Redis result
backend (Sentinel's too) gets PARKED; elsewhere, and when the run ignores its
result, nothing is stored, as before.  Cost: a run that parks makes one round
trip to the result store (two over its own STARTED); a run that does not, none.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from celery import states
from celery.backends.redis import RedisBackend

from .. import transport
from ..primitives import Primitive, scripts

try:  # Celery 5.5+: the tracer lets the request's ignore_result override the task's
    from celery.app.task import get_actual_ignore_result as _tracer_ignores
except ImportError:  # earlier, it reads the task's alone

    def _tracer_ignores(task: Any, request: Any) -> bool:
        return bool(task.ignore_result)


__all__ = ["PARKED", "mark_parked"]

logger = logging.getLogger("celery_redislock")

#: The state of a parked run in Celery's result store.
PARKED = "PARKED"


def mark_parked(task: Any, request: Any, prim: Primitive, holder: Optional[str]) -> bool:
    """Store PARKED for this run, which just parked behind ``prim``; True if stored.

    Never raises: the run is parked whatever happens here, so a failed store
    is logged and the run ends as parked.
    """
    backend = task.backend
    if not isinstance(backend, RedisBackend) or _ignores_result(task, request):
        return False
    info = {"kind": prim.noun, "name": prim.name, "holder": holder}
    try:
        return _store(backend, request, info)
    except Exception as exc:
        logger.warning(
            "%s[%s]: parked, but its state PARKED was not stored: %r", task.name, request.id, exc
        )
        return False


def _ignores_result(task: Any, request: Any) -> bool:
    """Whether Celery stores no outcome for this run: then no PARKED either."""
    if getattr(request, "ignore_result", False):
        return True  # the backend's own check, before it stores an outcome
    return bool(_tracer_ignores(task, request))


def _store(backend: Any, request: Any, info: dict[str, Any]) -> bool:
    """Store PARKED as the backend's own ``set()`` stores a state (SET with its
    expiry, PUBLISH for its result consumers), but only over what may be replaced."""
    meta = backend._get_result_meta(
        result=backend.encode_result(info, PARKED), state=PARKED, traceback=None, request=request
    )
    meta["task_id"] = request.id
    value = backend.encode(meta)
    client = backend.client
    key = backend.get_key_for_task(request.id).decode("utf-8")
    block = transport.KeyBlock([key], transport.encoding_of(client))
    ttl = int(backend.expires or 0)
    expected: Any = b""
    # At most twice: over nothing, then over this run's own STARTED once read.
    for _ in range(2):
        reply = transport.call(client, scripts.get("swap_publish"), block, [value, ttl, expected])
        if reply[0] == 1:
            return True
        now = reply[1] if len(reply) > 1 else None
        if now is None or not _own_start(backend.decode_result(now), request):
            return False  # an outcome, or the re-published run's own state: left as it is
        expected = now
    return False


def _own_start(meta: dict[str, Any], request: Any) -> bool:
    """Whether ``meta`` is the STARTED this run's tracer stored: this process's pid
    and this worker's name.  (Under a threads or gevent pool, a re-published run in
    this same process looks the same: its STARTED then shows PARKED until its outcome.)
    """
    info = meta.get("result")
    return (
        meta.get("status") == states.STARTED
        and isinstance(info, dict)
        and info.get("pid") == os.getpid()
        and info.get("hostname") == request.hostname
    )
