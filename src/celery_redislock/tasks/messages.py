"""The message headers the library adds to task messages, and how a run reads them.

- ``redislock_options``: the per-call options of ``apply_async(redislock={...})``;
- ``redislock_retries``: contention retries so far (not Celery's ``retries``);
- ``redislock_redis_error_retries``: re-sends so far because the lock store
  was unreachable (counted apart from contention retries);
- ``redislock_unique``: the job's claim on its unique key (publish-side
  uniqueness: the key, the policy, how long it holds);
- ``redislock_duplicate``: a duplicate sent only to end visibly, inside a
  canvas (the task id of the job that holds the key);
- ``redislock_rate_slot``: a run deferred to its rate-limit slot, which it
  holds: the seconds of its wait left after this hop (0: start now).

A re-sent copy of a run's message (a retry, a parked run) carries them all,
but the rate slot: that one is honoured once, by the copy that was sent to it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CALL_OPTIONS_HEADER",
    "DUPLICATE_HEADER",
    "RATE_HEADER",
    "REDIS_ERROR_RETRIES_HEADER",
    "RETRIES_HEADER",
    "UNIQUE_HEADER",
    "header",
    "message_headers",
]

#: Message header carrying the per-call options (``apply_async(redislock={...})``).
CALL_OPTIONS_HEADER = "redislock_options"
#: Message header counting contention retries (separate from Celery's ``retries``,
#: so contention never consumes the task's own ``max_retries``).
RETRIES_HEADER = "redislock_retries"
#: Message header counting re-sends because the lock store was unreachable,
#: against ``lock_redis_error_retries`` (apart from contention retries: see
#: :func:`celery_redislock.tasks.policies.retry_later`).
REDIS_ERROR_RETRIES_HEADER = "redislock_redis_error_retries"
#: Message header with the job's claim on its unique key: [key, policy, hold ms].
UNIQUE_HEADER = "redislock_unique"
#: Message header of a duplicate sent inside a canvas: the holder's task id.
DUPLICATE_HEADER = "redislock_duplicate"

#: Message header of a run deferred to its rate-limit slot: the wait left after this hop.
RATE_HEADER = "redislock_rate_slot"

_OURS = (CALL_OPTIONS_HEADER, RETRIES_HEADER, REDIS_ERROR_RETRIES_HEADER, UNIQUE_HEADER)


def header(request: Any, name: str) -> Any:
    """A header of this run's message (Celery shows custom headers in
    ``request.headers`` or as attributes of the request, depending on version)."""
    value = (request.headers or {}).get(name)
    return value if value is not None else getattr(request, name, None)


def message_headers(request: Any) -> dict[str, Any]:
    """The headers a re-sent copy of this run's message carries (ours included)."""
    headers = dict(request.headers or {})
    headers.pop(RATE_HEADER, None)  # a start slot serves one run, once
    for name in _OURS:
        value = header(request, name)
        if value is not None:
            headers.setdefault(name, value)
    return headers
