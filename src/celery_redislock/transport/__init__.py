"""How a command reaches Redis: through the user's own redis-py client.

Everything here goes through the connections of the client the caller gave:
its pool, connection class, packing, parser (hiredis when installed), error
mapping, retry policy, health checks, authentication and RESP3 push
handling.  A primitive's keys are encoded once (:class:`KeyBlock`); a call
is packed by the connection that sends it (``pack_command``), written with
its ``send_packed_command`` and read with its ``read_response``.

- :func:`call`: one script call, one round trip, optionally bounded by the
  caller's deadline (``_calls``, on a pooled connection: ``_roundtrip``).
- :func:`call_soon`: send now, read the reply later (:class:`Reply`, ``_reply``).
- :func:`call_batch`: many script calls, one round trip per server (renewal;
  ``_batch``).
- :func:`wait_pop`: a BLPOP bounded by the caller's deadline, on a connection
  of the waiting thread's own, never one of the pool's (a bounded pool stays
  free for holders to renew and release; ``_waits``, ``_own``).

A plain ``redis.ConnectionPool``'s connection is taken in steps of the
library's own that skip redis-py's stale-data check when a ``poll()`` finds
nothing to read (``_checkout``, measured by bench/transport_paths.py); other
pools through ``get_connection()``.  A cluster, or a client with its own
``execute_command``, is reached through its ``execute_command`` and
pipelines (``_execute``; ``_cluster`` finds a key's node).  A server that
does not know a script (NOSCRIPT) is given it in one place, ``_noscript``;
``_errors`` holds what the layer raises and gives error replies the same
class on every Redis version.

Nothing here knows about locks or Celery.
"""

from ._batch import call_batch
from ._calls import call, packed_call
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
    "packed_call",
    "refused_as_too_old",
    "wait_pop",
]
