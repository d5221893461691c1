"""Reading what the library keeps in Redis: SCAN for the names, then pipelined reads.

Every key of a name shares the hash-tagged base ``prefix:{name}`` (see
:mod:`celery_redislock.primitives.keys`), so one SCAN with a MATCH on
``prefix:{*`` finds every name of every kind, however many unrelated keys
the server holds, without KEYS.  The reads of a batch of names then go in
one pipeline (one round trip per batch), with the server's TIME, so that
every remaining lease and age is counted on the server's clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Optional

from redis.exceptions import RedisClusterException

from ..primitives import keys
from ..primitives.kinds import Kind as PrimitiveKind
from ..primitives.kinds import Mode
from ..tasks.owners import parse_owner
from .entries import Entry, Holder, Kind, ParkedRun, UniqueJobs, Waiter

__all__ = ["BATCH", "base_of", "details", "find", "read", "scan"]

#: Names read per pipeline.
BATCH = 500
#: Keys SCAN looks at per call.
SCAN_COUNT = 10000

#: What the part of a key after its hash tag says: (kind, part).
_LOCK_PARTS = {
    "lock": "hold",
    "fence": "fence",
    "queue": "queue",
    "qmeta": "meta",
    "parked": "pmsg",
    "inflight": "inflight",
}
_MULTI = {k.infix: Kind(k.value) for k in PrimitiveKind if k.multi}
_MULTI_PARTS = {**_LOCK_PARTS, "holders": "hold", "info": "info"}
#: Parts whose presence means the name is in use (a fence alone is history).
_LIVE = {"hold", "queue", "pmsg", "inflight", "unique"}
_MODE = {Mode.WRITE.value: "write", Mode.PERMIT.value: "permit", Mode.READ.value: "read"}


def text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def base_of(prefix: str, name: str) -> str:
    """The tagged base of ``name``; a ``#<digest>`` name as listed is taken as it is."""
    if name.startswith("#") and len(name) == 33 and all(c in "0123456789abcdef" for c in name[1:]):
        return f"{prefix}:{{{name}}}"
    return keys.tag(prefix, name)


def parse(prefix: str, key: str) -> Optional[tuple[str, Kind, str]]:
    """``(name, kind, part)`` of one of the library's keys, or None."""
    head = f"{prefix}:{{"
    if not key.startswith(head):
        return None
    end = key.find("}", len(head))
    if end < 0:
        return None
    name, rest = key[len(head) : end], key[end + 2 :]
    if key[end + 1 : end + 2] != ":":
        return None
    if rest == "unique":
        return name, Kind.UNIQUE, "unique"
    part = _LOCK_PARTS.get(rest)
    if part is not None:
        return name, Kind.LOCK, part
    infix, _, sub = rest.partition(":")
    kind = _MULTI.get(infix)
    if kind is not None and sub in _MULTI_PARTS:
        return name, kind, _MULTI_PARTS[sub]
    return None  # wake lists, and keys of later versions


def scan(client: Any, prefix: str, pattern: str = "*") -> dict[tuple[str, Kind], set[str]]:
    """Every (name, kind) in use under ``prefix`` whose name matches the glob
    ``pattern``, with the parts found (SCAN, never KEYS)."""
    match = f"{_glob_escape(prefix)}:{{{pattern}}}:*"
    found: dict[tuple[str, Kind], set[str]] = {}
    for raw in client.scan_iter(match=match, count=SCAN_COUNT):
        parsed = parse(prefix, text(raw))
        if parsed is not None:
            name, kind, part = parsed
            found.setdefault((name, kind), set()).add(part)
    return {k: parts for k, parts in found.items() if parts & _LIVE}


#: What an entry's reads default to when its key does not exist.
_ABSENT: dict[str, Any] = {
    "token": None,
    "pttl": -2,
    "fence": None,
    "queued": 0,
    "pmsg": 0,
    "inflight": [],
    "members": [],
    "info": {},
    "meta": [],
    "unique": [None] * 6,
}


def _reads(pipe: Any, prefix: str, name: str, kind: Kind, parts: Optional[set[str]]) -> list[str]:
    """Queue the reads of one entry on ``pipe``, skipping keys SCAN did not
    find (``parts``; None reads them all); the fields they fill, in order."""
    base = base_of(prefix, name)
    fields: list[str] = []

    def has(part: str) -> bool:
        return parts is None or part in parts

    if kind is Kind.UNIQUE:
        pipe.hmget(f"{base}:unique", "q", "qd", "r", "rd", "ti", "t")
        return ["unique"]
    if kind is Kind.LOCK:
        k: Any = keys.lock_keys_at(base)
        if has("hold"):
            pipe.get(k.lock)
            pipe.pttl(k.lock)
            fields += ["token", "pttl"]
    else:
        k = keys.multi_keys_at(base, PrimitiveKind(kind.value))
        if has("hold"):
            pipe.zrange(k.holders, 0, -1, withscores=True)
            fields.append("members")
        if has("info"):
            pipe.hgetall(k.info)
            fields.append("info")
        if kind is Kind.RWLOCK and has("meta"):
            pipe.hvals(k.meta)
            fields.append("meta")
    if has("fence"):
        pipe.get(k.fence)
        fields.append("fence")
    if has("queue"):
        pipe.zcard(k.queue)
        fields.append("queued")
    if has("pmsg"):
        pipe.hlen(k.pmsg)
        fields.append("pmsg")
    if has("inflight"):
        pipe.zrange(k.inflight, 0, -1)  # (a granted parked run's hold names no worker)
        fields.append("inflight")
    return fields


def _int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _entry(
    prefix: str, name: str, kind: Kind, r: dict[str, Any], now_ms: int, now_us: int
) -> Entry:
    base = base_of(prefix, name)
    if kind is Kind.UNIQUE:
        h = r["unique"]
        jobs: list[Any] = []
        for i in (0, 2, 4):
            job, until = h[i], h[i + 1]
            live = job is not None and until is not None and int(until) >= now_ms
            jobs += [text(job), int(until) - now_ms] if live else [None, 0]
        return Entry(kind, name, base, unique=UniqueJobs(*jobs))
    fence = _int(r["fence"])
    flying = {text(t) for t in r["inflight"]}
    waiters, parked = _lines(r["queued"], r["pmsg"], flying)
    if kind is Kind.LOCK:
        holders: tuple[Holder, ...] = ()
        if r["token"] is not None:
            ttl = int(r["pttl"]) if int(r["pttl"]) >= 0 else None
            held = text(r["token"])
            holders = (Holder.of(held, "exclusive", fence, ttl, now_us, held in flying),)
        return Entry(kind, name, base, holders, fence, None, waiters, parked)
    info = {text(k): text(v) for k, v in r["info"].items()}
    writer = info.get("!writer")
    out = []
    for member, score in r["members"]:
        token = text(member)
        if int(score) < now_ms:
            continue  # lapsed: the next script call on the name drops it
        mode = "permit" if kind is Kind.SEMAPHORE else ("write" if token == writer else "read")
        fence_of = _int(info.get(token))
        ttl_ms = int(score) - now_ms
        out.append(Holder.of(token, mode, fence_of, ttl_ms, now_us, token in flying))
    limit = int(info.get("!limit", "1")) if kind is Kind.SEMAPHORE else None
    writers = sum(1 for m in r["meta"] if text(m).rsplit(":", 1)[-1] == Mode.WRITE.value)
    return Entry(kind, name, base, tuple(out), fence, limit, waiters, parked, writers)


def _lines(queued: Any, pmsg: Any, inflight: set[str]) -> tuple[int, int]:
    """(blocked waiters, parked runs): the line holds both; a parked run's
    payload is kept until its run claims it, in flight too."""
    parked_in_line = int(pmsg) - len(inflight)
    return max(0, int(queued) - parked_in_line), int(pmsg)


def _timed_pipeline(client: Any) -> tuple[Any, Any]:
    """A pipeline whose first reply is the server's TIME, and None; or, where
    a pipeline cannot carry TIME (Redis Cluster: it has no key), a pipeline
    and the TIME read before it."""
    pipe = client.pipeline(transaction=False)
    try:
        pipe.time()
    except RedisClusterException:
        return pipe, client.time()
    return pipe, None


def _clock(reply: Any) -> tuple[int, int]:
    """The server's clock from a TIME reply: (ms, µs)."""
    sec, usec = reply
    return int(sec) * 1000 + int(usec) // 1000, int(sec) * 1_000_000 + int(usec)


def read(
    client: Any,
    prefix: str,
    names: Iterable[tuple[str, Kind]],
    parts: Optional[dict[tuple[str, Kind], set[str]]] = None,
) -> Iterator[Entry]:
    """The entries of ``names``, one pipeline per :data:`BATCH` of them;
    with ``parts`` (what :func:`scan` found), only the keys that exist are read."""
    todo = list(names)
    for start in range(0, len(todo), BATCH):
        batch = todo[start : start + BATCH]
        pipe, clock = _timed_pipeline(client)
        fields = [
            _reads(pipe, prefix, name, kind, None if parts is None else parts.get((name, kind)))
            for name, kind in batch
        ]
        replies = pipe.execute()
        i = 0 if clock is not None else 1
        now_ms, now_us = _clock(clock if clock is not None else replies[0])
        for (name, kind), names_of in zip(batch, fields):
            r = dict(_ABSENT)
            r.update(zip(names_of, replies[i : i + len(names_of)]))
            i += len(names_of)
            yield _entry(prefix, name, kind, r, now_ms, now_us)


def find(client: Any, prefix: str, name: str) -> list[tuple[str, Kind]]:
    """The kinds ``name`` is in use as (one pipeline of EXISTS)."""
    base = base_of(prefix, name)
    probes: dict[Kind, Any] = {
        Kind.LOCK: keys.lock_keys_at(base),
        Kind.SEMAPHORE: keys.multi_keys_at(base, PrimitiveKind.SEMAPHORE),
        Kind.RWLOCK: keys.multi_keys_at(base, PrimitiveKind.RWLOCK),
    }
    pipe = client.pipeline(transaction=False)
    for k in probes.values():
        for key in (k[0], k.queue, k.pmsg, k.inflight):
            pipe.exists(key)
    pipe.exists(f"{base}:unique")
    found = pipe.execute()
    kinds = [kind for i, kind in enumerate(probes) if any(found[4 * i : 4 * i + 4])]
    if found[-1]:
        kinds.append(Kind.UNIQUE)
    shown = text(base[len(prefix) + 2 : -1])
    return [(shown, kind) for kind in kinds]


def details(client: Any, prefix: str, entry: Entry) -> tuple[list[Waiter], list[ParkedRun]]:
    """The blocked waiters and parked runs of ``entry``, in line order."""
    if entry.kind is Kind.UNIQUE:
        return [], []
    k: Any = keys.of_kind_at(PrimitiveKind(entry.kind.value), entry.key)
    pipe, clock = _timed_pipeline(client)
    pipe.zrange(k.queue, 0, -1, withscores=True)
    pipe.hgetall(k.meta)
    pipe.zrange(k.inflight, 0, -1, withscores=True)
    pipe.hkeys(k.pmsg)
    replies = pipe.execute()
    if clock is None:
        clock, replies = replies[0], replies[1:]
    line, meta, inflight, payloads = replies
    now_ms, _ = _clock(clock)
    meta = {text(t): text(m) for t, m in meta.items()}
    parked_tokens = {text(t) for t in payloads}
    waiters: list[Waiter] = []
    parked: list[ParkedRun] = []
    for token in (text(t) for t, _deadline in inflight):
        owner = parse_owner(token)
        run = ParkedRun(
            token, entry.name, entry.kind, owner.task_id, owner.task_name, None, None, True
        )
        parked.append(run)
    for position, (token, score) in enumerate((text(t), int(s)) for t, s in line):
        owner = parse_owner(token)
        fields = meta.get(token, "").split(":")
        mode = _MODE.get(fields[-1], "exclusive") if len(fields) >= 4 else "exclusive"
        if entry.kind is Kind.LOCK:
            mode = "exclusive"
        waited = max(0, now_ms - score)
        if token in parked_tokens or (len(fields) >= 3 and fields[2] == "p"):
            parked.append(
                ParkedRun(
                    token,
                    entry.name,
                    entry.kind,
                    owner.task_id,
                    owner.task_name,
                    position,
                    waited,
                    False,
                )
            )
        else:
            waiters.append(Waiter(token, mode, waited, owner.task_id, owner.task_name))
    return waiters, parked
