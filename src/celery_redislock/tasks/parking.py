"""``on_contention="park"``: contended runs wait in Redis, not in the broker.

A contended run stores its own message (a Celery signature, serialized with
the task's serializer) in the FIFO queue of its lock or semaphore and ends.
Whoever's script call later grants it (normally the release of the holder)
gets the payload back and re-publishes it with the same task id, args,
options and callbacks.  The re-published run presents the parked token and
claims its reserved grant; a second delivery of the same message finds the
token claimed and is dropped, so nothing runs twice.

Crash safety: a granted parked task is "in flight" until its run claims it.
If the worker that took it dies before publishing, the reservation lapses
after ``redislock_park_reserve`` seconds and the next script call on that
primitive, or at the latest the sweeper (``redislock_park_sweep_interval``),
re-grants and re-publishes it.  The sweeper also serves parked queues behind
a holder that crashed.  Worst case before a lost hand-over is re-published:
``park_reserve + park_sweep_interval`` (+ one round trip).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import uuid
import weakref
from typing import Any, Optional

from kombu import serialization

from .. import config, signals, transport
from ..primitives import Kind, Lock, Mode, Primitive, Semaphore, scripts
from ..primitives.protocol import Handoff
from ..primitives.protocol import decode as text
from ..primitives.rwlock import Side
from . import park_recovery

__all__ = [
    "PARK_HEADER",
    "SENT_HEADER",
    "Sweeper",
    "decode",
    "encode",
    "publisher",
]

logger = logging.getLogger("celery_redislock.park")

#: Header carrying the parked token of a re-published run.
PARK_HEADER = "redislock_park"
#: Header with the publish time (ms) of a park-policy task: its place in line.
SENT_HEADER = "redislock_sent"

_FAULTS = frozenset(filter(None, os.environ.get("REDISLOCK_FAULTS", "").split(",")))


def fault(point: str) -> None:
    """Test hook: SIGKILL this process at ``point`` when REDISLOCK_FAULTS names it."""
    if point in _FAULTS:
        logger.warning("fault injection: killing pid %d at %s", os.getpid(), point)
        os.kill(os.getpid(), signal.SIGKILL)


def encode(sig: Any, serializer: str) -> bytes:
    """A signature as bytes: content type, newline, body."""
    content_type, _encoding, body = serialization.dumps(dict(sig), serializer=serializer)
    data: bytes = body.encode("utf-8") if isinstance(body, str) else body
    return str(content_type).encode("ascii") + b"\n" + data


def decode(payload: bytes) -> dict[str, Any]:
    content_type, _, body = payload.partition(b"\n")
    ctype = content_type.decode("ascii")
    encoding = "binary" if ctype in ("application/x-python-serialize",) else "utf-8"
    result: dict[str, Any] = serialization.loads(body, ctype, encoding, accept={ctype})
    return result


def publisher(app: Any, prim: Optional[Primitive] = None) -> Any:
    """An ``on_parked`` callback that re-publishes granted parked tasks with ``app``.

    With ``prim``, the primitive is first put in the recovery index due when
    the reservations lapse, so a hand-over lost with this process is found by
    a sweeper within ``park_reserve + park_sweep_interval``.
    """

    # Weakly: the primitive keeps this callback, and a cycle would leave both
    # (and a task run's request) to the garbage collector.
    prim_ref = weakref.ref(prim) if prim is not None else None

    def publish(parked: list[Handoff]) -> None:
        owner = prim_ref() if prim_ref is not None else None
        if owner is not None:
            try:
                register(owner, owner.reserve_ms + 1)
            except Exception:
                logger.exception("could not schedule recovery of %s %r", owner.noun, owner.name)
        fault("before-park-publish")
        for token, payload in parked:
            try:
                sig = app.signature(decode(payload))
                sig.apply_async()
            except Exception:
                # Not lost: the reservation lapses and recovery re-publishes it.
                logger.exception(
                    "could not re-publish parked task %s; it is retried after "
                    "its reservation lapses",
                    token,
                )
            else:
                logger.info("re-published parked task %s", token.split("|", 1)[0])
                if signals.task_republished.receivers:
                    signals.task_republished.send(
                        sender=app.tasks.get(sig.task), task_id=sig.id, task_name=sig.task
                    )

    return publish


#: The hash tag of the recovery index and the store's epoch: a name starting
#: with ``#`` that is no digest, so no lock's keys can share it.
_TAG = "{#parked}"


def index_key(prefix: str) -> str:
    """The recovery index: primitives with parked runs, by when to check them."""
    return f"{prefix}:{_TAG}:index"


def epoch_key(prefix: str) -> str:
    """The store's epoch, written once: gone when the store lost its data."""
    return f"{prefix}:{_TAG}:epoch"


def legacy_index_key(prefix: str) -> str:
    """The untagged index key of earlier development versions; drained once."""
    return f"{prefix}:parked-index"


def primitive(
    client: Any, prefix: str, kind: Kind, name: str, reserve: float, on_handoff: Any
) -> Primitive:
    """A handle on the primitive an index member names, for its ``recover()``."""
    prim: Primitive
    if kind is Kind.SEMAPHORE:
        prim = Semaphore(client, name, 1, prefix=prefix, renew=False)
    elif kind is Kind.RWLOCK:
        prim = Side(client, name, Mode.READ, 30.0, prefix=prefix, renew=False)
    else:
        prim = Lock(client, name, prefix=prefix, renew=False)
    return configure(prim, reserve, on_handoff)


def configure(prim: Primitive, reserve: float, on_handoff: Any) -> Primitive:
    """Give ``prim`` the reservation lease and re-publisher of parked entries it grants."""
    prim.reserve_ms = max(1, int(reserve * 1000))
    prim.on_handoff = on_handoff
    return prim


def register(prim: Primitive, check_after_ms: int) -> None:
    """Put ``prim`` in the recovery index (one round trip, only when a run parks)."""
    member = f"{prim.kind.index_prefix}:{prim.name}"
    _index(prim.client, prim.prefix, ["add", member, max(1, check_after_ms)])


def _index(client: Any, prefix: str, args: list[Any]) -> Any:
    """One call of the park index script (its keys live in a slot of their own)."""
    block = transport.KeyBlock(
        [index_key(prefix), epoch_key(prefix)], transport.encoding_of(client)
    )
    return transport.call(client, scripts.get("park_index"), block, args)


def drain_legacy_index(client: Any, prefix: str) -> int:
    """Move the members of the index an older version kept into this one's."""
    old = legacy_index_key(prefix)
    members = client.zrange(old, 0, -1)
    for member in members:
        _index(client, prefix, ["add", member, 1])
    if members:
        client.zrem(old, *members)
        logger.info("moved %d name(s) from the recovery index %s", len(members), old)
    return len(members)


def republish_fresh(app: Any, payload: bytes) -> None:
    """Publish a parked run's message again without its park token: the store
    lost its entry, so it arrives as a new run (same task id, same place in line)."""
    sig = app.signature(decode(payload))
    headers = dict(sig.options.get("headers") or {})
    headers.pop(PARK_HEADER, None)
    sig.options["headers"] = headers
    sig.options.pop(PARK_HEADER, None)
    sig.apply_async()


class Sweeper:
    """Per-process thread that recovers parked tasks of crashed holders/releasers."""

    BATCH = 50

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pid = os.getpid()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="redislock-park-sweeper", daemon=True)
        self.watch = park_recovery.Watch()

    def _run(self) -> None:
        settings = config.settings_for(self.app)
        try:  # at once: the first sweep learns the store's epoch
            drain_legacy_index(config.client_for(self.app), settings.key_prefix)
            self.sweep()
        except Exception:
            logger.exception("park sweep failed")
        while not self.stop.wait(settings.park_sweep_interval):
            try:
                self.sweep()
            except Exception:
                logger.exception("park sweep failed")

    def sweep(self) -> int:
        """One pass; returns how many primitives it checked."""
        settings = config.settings_for(self.app)
        client = config.client_for(self.app)
        prefix = settings.key_prefix
        claim_ms = int(settings.park_reserve * 1000)
        claimed = self.watch.before_sweep(client)
        # (A new epoch each time: one written again after a loss must differ.)
        reply = _index(client, prefix, ["due", self.BATCH, claim_ms, uuid.uuid4().hex])
        epoch, run_id, due = text(reply[0]), text(reply[1]), reply[2:]
        lost = self.watch.after_sweep(epoch, run_id)
        if lost is not None:
            logger.warning("the lock store %s; recovering the runs this process parked", lost)
            park_recovery.recover(self.app, client, lost, republish_fresh)
        else:
            # Gone while the store kept its data: claimed by their runs.
            park_recovery.memory().forget(claimed)
        for i in range(0, len(due), 2):
            member = text(due[i])
            claim = due[i + 1]
            infix, _, name = member.partition(":")
            try:
                prim = primitive(
                    client,
                    settings.key_prefix,
                    Kind.of_index_prefix(infix) or Kind.LOCK,
                    name,
                    settings.park_reserve,
                    publisher(self.app),
                )
                nxt = prim.recover()
            except Exception:
                logger.exception("recovering parked tasks of %s failed", member)
                continue
            _index(client, prefix, ["done", member, nxt, claim])
        return len(due) // 2


_sweepers: dict[int, Sweeper] = {}
_lock = threading.Lock()


def ensure_sweeper(app: Any) -> None:
    """Start this process's sweeper for ``app`` once (again after fork)."""
    key = id(app)
    s = _sweepers.get(key)
    if s is not None and s.pid == os.getpid():
        return
    with _lock:
        s = _sweepers.get(key)
        if s is None or s.pid != os.getpid():
            s = _sweepers[key] = Sweeper(app)
            s.thread.start()
