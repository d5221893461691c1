"""Lock, Semaphore, ReadWriteLock and RateLimiter: the Redis primitives, usable without Celery.

What lives here: the sans-I/O protocol every primitive speaks
(``protocol.py``: the script calls and their replies, ``results.py``: what
the replies mean; ``kinds.py``: Kind and
Mode; ``arguments.py``: the argument checks), the sync driver of it
(``_core.py`` the state and calls, ``_release.py``, ``_parking.py``,
``_primitive.py`` the acquire loop, ``_replicas.py``, ``_errors.py``), the
primitives themselves (``lock.py``, ``semaphore.py``, ``rwlock.py``,
``rate_limiter.py`` over ``rates.py``, the rate protocol), the
per-process lease keeper (``_keeper.py``), key layout (``keys.py``), owner
tokens (``tokens.py``), unique keys (``unique.py``) and the Lua scripts
(``lua/``, loaded by ``scripts.py``).  What it may import: the standard
library, redis-py, :mod:`celery_redislock.transport`, and the package's
exceptions and validators.  Never Celery.
"""

from ._keeper import add_lost_listener, keeper, remove_lost_listener
from ._primitive import Primitive
from ._release import Release
from .kinds import Kind, Mode
from .lock import Lock, bump_fence, reap, release_token
from .rate_limiter import RateLimiter
from .rwlock import ReadWriteLock
from .semaphore import Semaphore

__all__ = [
    "Kind",
    "Lock",
    "Mode",
    "Primitive",
    "RateLimiter",
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
