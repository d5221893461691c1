"""Lock, Semaphore and ReadWriteLock: the Redis primitives, usable without Celery.

What lives here: the primitives, the protocol they share (``_base.py``), the
per-process lease keeper (``_keeper.py``), key layout (``keys.py``), owner
tokens (``tokens.py``) and the Lua scripts (``lua/``, loaded by
``_scripts.py``).  What it may import: the standard library, redis-py,
:mod:`celery_redislock.transport`, and the package's exceptions and
validators.  Never Celery.
"""

from ._base import Primitive, Release
from ._keeper import add_lost_listener, keeper, remove_lost_listener
from .lock import Lock, bump_fence, reap, release_token
from .rwlock import ReadWriteLock
from .semaphore import Semaphore

__all__ = [
    "Lock",
    "Primitive",
    "ReadWriteLock",
    "Release",
    "Semaphore",
    "add_lost_listener",
    "bump_fence",
    "keeper",
    "reap",
    "release_token",
    "remove_lost_listener",
]
