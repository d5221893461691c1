"""Start and stop private redis-server processes on free loopback ports.

The library's own :mod:`celery_redislock.testing.server`, under the names the
suite has always used: PATH's redis-server, else the embedded one (the test
extra brings it), refused below Redis 6.2.  Tests that need more of a server
(TLS, redis-cli for a cluster, Sentinel of Redis 7) skip, naming what is missing.
"""

from __future__ import annotations

from celery_redislock.testing.server import (
    RedisServer,
    RedisServerNotFound,
    find_redis_server,
    free_port,
    server_version,
)

__all__ = ["RedisServer", "RedisServerNotFound", "find_redis_server", "free_port", "server_version"]
