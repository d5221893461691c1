"""How a command reaches Redis: through the user's own redis-py client.

Everything here goes through the connections of the client the caller gave:
its pool, connection class, parser (hiredis when installed), error mapping,
retry policy, health checks, authentication and RESP3 push handling.  What
this package adds is packing: a primitive's keys are encoded once
(:class:`KeyBlock`) and a script call is packed by hand, then sent with the
connection's ``send_packed_command`` and read with its ``read_response``.

- :func:`call`: one script call, one round trip (NOSCRIPT loads and resends),
  optionally bounded by the caller's deadline.
- :func:`call_soon`: send now, read the reply later (:class:`Reply`).
- :func:`call_batch`: many script calls, one round trip per server (renewal).
- :func:`wait_pop`: a BLPOP bounded by the caller's deadline, on a connection
  of the waiting thread's own, never one of the pool's (a bounded pool stays
  free for holders to renew and release).

Nothing here knows about locks or Celery.
"""

from ._batch import call_batch
from ._calls import call
from ._encode import KeyBlock, encoding_of
from ._errors import (
    UNREACHABLE,
    DeadlineExceeded,
    NotReplicated,
    ReplyLost,
    refused_as_too_old,
)
from ._own import connect_timeout
from ._reply import Reply, call_soon
from ._waits import wait_pop

__all__ = [
    "UNREACHABLE",
    "DeadlineExceeded",
    "KeyBlock",
    "NotReplicated",
    "Reply",
    "ReplyLost",
    "call",
    "call_batch",
    "call_soon",
    "connect_timeout",
    "encoding_of",
    "refused_as_too_old",
    "wait_pop",
]
