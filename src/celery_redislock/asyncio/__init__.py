"""Lock, Semaphore, ReadWriteLock and RateLimiter for asyncio, over ``redis.asyncio``.

The asyncio driver of the primitives' protocol
(:mod:`celery_redislock.primitives.protocol`): the same keys, scripts, queues
and fences as the sync :class:`celery_redislock.Lock` and friends, so a sync
holder hands over to an asyncio waiter and back.  Clients: ``redis.asyncio.Redis``
(also ``redis.asyncio.sentinel.Sentinel(...).master_for(...)``) and
``redis.asyncio.cluster.RedisCluster``.

Modules: ``primitive.py`` (acquire, release, extend), ``lock.py``,
``semaphore.py``, ``rwlock.py``, ``rate_limiter.py``; ``calls.py`` (script calls, the one place
they are sent), ``waits.py`` (a blocking acquire's waits for its hand-over),
``renewal.py`` (one renewer per event loop and client),
``cancellation.py`` (work a cancellation must not cut short).  What it may import:
the standard library, redis-py, :mod:`celery_redislock.primitives`,
:mod:`celery_redislock.transport`'s public names, and the package's
exceptions and validators.  Never Celery.
"""

from .lock import Lock
from .primitive import Primitive
from .rate_limiter import RateLimiter
from .rwlock import ReadWriteLock
from .semaphore import Semaphore

__all__ = ["Lock", "Primitive", "RateLimiter", "ReadWriteLock", "Semaphore"]
