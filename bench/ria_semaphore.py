"""The fair counting semaphore of "Redis in Action" (J. Carlson, 2013), as a baseline.

``acquire_fair_semaphore`` and ``release_fair_semaphore`` follow the book's
section 6.3.2 ("Fair semaphores") line for line, on redis-py's current
``zadd`` API:

- ``semname``          ZSET  identifier -> client time of acquire (the timeout set)
- ``semname:owner``    ZSET  identifier -> counter value (the order of arrival)
- ``semname:counter``  STRING, INCR'd once per attempt

Acquiring takes two MULTI/EXEC transactions (three when it fails: the third
takes the identifier back out).  Between the first (INCR) and the second
(ZADD both sets, ZRANK) nothing is held, which is the race the book itself
points out in section 6.3.4 ("Preventing race conditions"): if A increments
the counter before B but B adds itself and checks its rank first, B takes the
last permit; A then ranks ahead of B and takes it too, and B does not find
out until it releases or refreshes.  Kept here on purpose:
bench/semaphores.py measures it.

Releasing is one transaction (ZREM from both sets).  The book has no blocking
acquire; :class:`RiASemaphore` polls with a fixed sleep, the usual wrapper.
Holders longer than ``timeout`` must call the book's refresh_fair_semaphore;
the benchmark's holds are far shorter, so it is left out.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional

__all__ = ["RiASemaphore", "acquire_fair_semaphore", "release_fair_semaphore"]


def acquire_fair_semaphore(
    conn: Any, semname: str, limit: int, timeout: float = 10
) -> Optional[str]:
    """An identifier when a permit was taken, else None."""
    identifier = str(uuid.uuid4())
    czset = semname + ":owner"
    ctr = semname + ":counter"

    now = time.time()
    pipeline = conn.pipeline(True)
    # Time out old holders, and drop them from the owner set too.
    pipeline.zremrangebyscore(semname, "-inf", now - timeout)
    pipeline.zinterstore(czset, {czset: 1, semname: 0})

    # First transaction ends here: the counter value orders the attempts.
    pipeline.incr(ctr)
    counter = pipeline.execute()[-1]

    # Second transaction: join both sets, then look at our rank.
    pipeline.zadd(semname, {identifier: now})
    pipeline.zadd(czset, {identifier: counter})

    pipeline.zrank(czset, identifier)
    if pipeline.execute()[-1] < limit:
        return identifier

    # Did not get it: take the identifier back out (a third transaction).
    pipeline.zrem(semname, identifier)
    pipeline.zrem(czset, identifier)
    pipeline.execute()
    return None


def release_fair_semaphore(conn: Any, semname: str, identifier: str) -> bool:
    """True when the identifier was still a holder (not timed out)."""
    pipeline = conn.pipeline(True)
    pipeline.zrem(semname, identifier)
    pipeline.zrem(semname + ":owner", identifier)
    return bool(pipeline.execute()[0])


class RiASemaphore:
    """One holder's handle on a Redis in Action fair semaphore, with a polling acquire.

    ``acquire(blocking=True)`` retries every ``poll`` seconds until it gets a
    permit; ``acquire(blocking=False)`` makes one attempt.
    """

    def __init__(
        self, conn: Any, name: str, limit: int, timeout: float = 10, poll: float = 0.01
    ) -> None:
        self.conn = conn
        self.name = name
        self.limit = limit
        self.timeout = timeout
        self.poll = poll
        self.identifier: Optional[str] = None

    def acquire(self, blocking: bool = True) -> bool:
        while True:
            self.identifier = acquire_fair_semaphore(self.conn, self.name, self.limit, self.timeout)
            if self.identifier is not None:
                return True
            if not blocking:
                return False
            time.sleep(self.poll)

    def release(self) -> None:
        identifier, self.identifier = self.identifier, None
        if identifier is not None:
            release_fair_semaphore(self.conn, self.name, identifier)
