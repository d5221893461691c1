"""What the demo's tasks write down, so the checks read facts rather than clocks.

Every body appends ``start`` and ``end`` to the Redis list ``demo:events``,
inside its hold: the list's order is Redis's own order of those writes, so
overlaps, counts and the order of runs are read from it exactly, whatever the
timing.  ``FencedStore`` is the downstream store that checks fencing tokens.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import redis

from .config import lock_url

EVENTS = "demo:events"

_client: Optional[redis.Redis] = None
_pid = 0


def client() -> redis.Redis:
    """This process's client (made again in a forked pool child)."""
    global _client, _pid
    if _client is None or _pid != os.getpid():
        _client, _pid = redis.Redis.from_url(lock_url(), decode_responses=True), os.getpid()
    return _client


def note(event: str, **fields: Any) -> None:
    client().rpush(EVENTS, json.dumps({"event": event, "at": time.time(), **fields}))


def events(r: redis.Redis, task: Optional[str] = None) -> list[dict[str, Any]]:
    """The recorded events, in Redis's order, of one task (by its short name) or all."""
    seen = [json.loads(e) for e in r.lrange(EVENTS, 0, -1)]
    return [e for e in seen if task is None or e.get("task") == task]


def clear(r: redis.Redis, prefix: str) -> None:
    """Delete the demo's own keys (its records, and its locks under ``prefix``)."""
    for pattern in ("demo:*", f"{prefix}:*"):
        for key in r.scan_iter(pattern, count=1000):
            r.delete(key)


# KEYS[1] the value, KEYS[2] the highest fence that wrote it; ARGV[1] value,
# ARGV[2] the writer's fence.  Returns {1, fence} when written, {0, newest}
# when refused: a writer with a newer fence has written since.
FENCED_WRITE = """
local newest = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = tonumber(ARGV[2])
if fence < newest then
  return {0, newest}
end
redis.call('SET', KEYS[2], fence)
redis.call('SET', KEYS[1], ARGV[1])
return {1, fence}
"""


class FencedStore:
    """A tiny key-value store that refuses writes older than the last one it took."""

    def __init__(self, r: redis.Redis) -> None:
        self.client = r
        self.script = r.register_script(FENCED_WRITE)

    def write(self, name: str, value: str, fence: int) -> tuple[bool, int]:
        base = f"demo:store:{{{name}}}"  # one hash tag: both keys in one slot
        ok, newest = self.script(keys=[f"{base}:value", f"{base}:fence"], args=[value, fence])
        return bool(ok), int(newest)

    def read(self, name: str) -> Optional[str]:
        value = self.client.get(f"demo:store:{{{name}}}:value")
        return None if value is None else str(value)
