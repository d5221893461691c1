"""The Celery app that worker subprocesses in the integration tests load.

Configured from REDISLOCK_TEST_REDIS (a redis://host:port base URL): broker on
db 1, results on db 2, locks on db 0, and what the task bodies record on db 3.
Bodies record (start, end, fence, pid) so tests can assert measured facts:
overlap, run counts, order.
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery

from celery_redislock import LockedTask

BASE = os.environ.get("REDISLOCK_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")

app = Celery("redislock_tests", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redislock_url=f"{BASE}/0",
    redislock_lock_retry_backoff=0.05,
    redislock_lock_retry_backoff_max=0.4,
    redislock_lock_ttl=5.0,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_track_started=False,
    result_expires=600,
    broker_connection_retry_on_startup=True,
)

_rec: redis.Redis | None = None


def recorder() -> redis.Redis:
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(f"{BASE}/3")
    return _rec


def record(tag: str, **fields: object) -> None:
    recorder().rpush(f"runs:{tag}", json.dumps(fields))


def body(task, tag: str, duration: float, **extra: object) -> dict:
    start = time.monotonic()
    time.sleep(duration)
    end = time.monotonic()
    fence = getattr(task.request, "lock_fence", None)
    record(tag, id=task.request.id, start=start, end=end, fence=fence, pid=os.getpid(), **extra)
    return {"fence": fence}


def _make(policy: str):
    @app.task(
        name=f"t.job_{policy}",
        base=LockedTask,
        bind=True,
        on_contention=policy,
        lock_key=["job"],
        lock_wait_timeout=30,
    )
    def job(self, job: str, tag: str, duration: float = 0.3, seq: int = 0):
        return body(self, tag, duration, job=job, seq=seq)

    return job


job_skip = _make("skip")
job_retry = _make("retry")
job_wait = _make("wait")
job_fail = _make("fail")


# ---------------------------------------------------------------------------
# Tasks of the LockedTask integration tests (tests/integration/test_task_*.py).
#
# Bodies take no ``self`` (bind=False) and find their request through
# ``current_task``; test_task_keys.py covers bind=True separately.  Every body
# records what it saw (request fields, fence, timings) with ``probe``.


if os.environ.get("REDISLOCK_TEST_LOCK_URL"):
    # A worker whose lock store is elsewhere (e.g. a dead port) than its broker.
    app.conf.redislock_url = os.environ["REDISLOCK_TEST_LOCK_URL"]

if os.environ.get("REDISLOCK_TEST_RESULT_CONF"):
    # A worker whose results are stored otherwise (compressed, another serializer).
    app.conf.update(json.loads(os.environ["REDISLOCK_TEST_RESULT_CONF"]))


if os.environ.get("REDISLOCK_TEST_CONF"):
    # A worker with settings of its own (JSON), e.g. its lock_on_redis_error.
    app.conf.update(json.loads(os.environ["REDISLOCK_TEST_CONF"]))


def configure(base: str) -> None:
    """Point the app at another Redis (the test process imports this module once)."""
    global BASE, _rec
    from celery_redislock import config as _config

    BASE = base.rstrip("/")
    app.conf.update(broker_url=f"{BASE}/1", result_backend=f"{BASE}/2", redislock_url=f"{BASE}/0")
    _rec = None
    _config.reset(app)


def _jsonable(value: object) -> object:
    from kombu.utils.json import dumps

    return json.loads(dumps(value))  # plain JSON: kombu's loads would revive UUIDs etc.


def probe(tag: str, duration: float = 0.0, **extra: object) -> dict:
    """Record this run's request as seen by the body, sleeping ``duration`` inside."""
    from celery import current_task

    req = current_task.request
    hold = getattr(req, "redislock", None)
    start = time.monotonic()
    recorder().rpush(f"started:{tag}", json.dumps({"id": req.id, "start": start}))
    time.sleep(duration)
    end = time.monotonic()
    fence = getattr(req, "lock_fence", None)
    record(
        tag,
        id=req.id,
        task=current_task.name,
        start=start,
        end=end,
        wall_end=time.time(),
        fence=fence,
        hold_fence=getattr(hold, "fence", None),
        lock_name=getattr(hold, "name", None),
        lock_key=getattr(hold, "key", None),
        pid=os.getpid(),
        retries=req.retries,
        lock_retries=getattr(req, "redislock_retries", None),
        x_trace=getattr(req, "x_trace", None),
        delivery_info=_jsonable(
            {k: (req.delivery_info or {}).get(k) for k in ("exchange", "routing_key", "priority")}
        ),
        args=_jsonable(list(req.args or ())),
        kwargs=_jsonable(dict(req.kwargs or {})),
        callbacks=_jsonable(req.callbacks),
        errbacks=_jsonable(req.errbacks),
        chain=_jsonable(req.chain),
        eager=bool(req.is_eager),
        **extra,
    )
    return {"fence": fence, "id": req.id}


def _policy_task(name: str, policy: str, **options: object):
    @app.task(
        name=name,
        base=LockedTask,
        on_contention=policy,
        lock_key=["job"],
        lock_wait_timeout=30,
        **options,
    )
    def job(job: str, tag: str, duration: float = 0.3, seq: int = 0):
        return probe(tag, duration, job=job, seq=seq)

    return job


lt_skip = _policy_task("lt.skip", "skip")
lt_retry = _policy_task("lt.retry", "retry")
lt_wait = _policy_task("lt.wait", "wait")
lt_fail = _policy_task("lt.fail", "fail")
lt_retry_max = _policy_task("lt.retry_max", "retry", lock_retry_max=2)
lt_ttl2 = _policy_task("lt.ttl2", "fail", lock_ttl=2)


@app.task(name="lt.rec")
def lt_rec(*values: object, tag: str, label: str = "") -> list:
    """A plain (unlocked) task for callbacks, chains and chords: records its input."""
    record(tag, label=label, values=_jsonable(list(values)), at=time.monotonic())
    return list(values)


@app.task(name="lt.errback")
def lt_errback(task_id: str, *, tag: str) -> None:
    """An old-style errback (called with the failed task's id).

    ``tag`` is keyword-only: Celery before 5.5 calls an errback whose function
    takes more than one positional parameter with (request, exc, traceback).
    """
    record(tag, label="errback", failed=task_id, at=time.monotonic())


@app.task(name="lt.bound", base=LockedTask, bind=True, on_contention="skip", lock_key=["job"])
def lt_bound(self, job: str, tag: str, duration: float = 0.3):
    return probe(tag, duration, job=job, self_fence=getattr(self.request, "lock_fence", None))


@app.task(name="lt.defaults", base=LockedTask, on_contention="skip", lock_key=["job", "region"])
def lt_defaults(job: str, tag: str, region: str = "eu", duration: float = 0.3):
    return probe(tag, duration, job=job, region=region)


@app.task(name="lt.template", base=LockedTask, on_contention="skip", lock_key="user:{user_id}")
def lt_template(user_id: int, tag: str, duration: float = 0.3):
    return probe(tag, duration, user_id=user_id)


def _customer_key(order: dict, tag: str, duration: float = 0.3) -> str:
    return f"customer:{order['customer']}"


@app.task(name="lt.callable", base=LockedTask, on_contention="skip", lock_key=_customer_key)
def lt_callable(order: dict, tag: str, duration: float = 0.3):
    return probe(tag, duration, order=order)


@app.task(
    name="lt.typed", base=LockedTask, on_contention="skip", lock_key=["ident", "when", "amount"]
)
def lt_typed(ident, when, amount, tag: str, duration: float = 0.3):
    return probe(tag, duration, types=[type(v).__name__ for v in (ident, when, amount)])


@app.task(name="lt.outcome", base=LockedTask, on_contention="fail", lock_key=["tag"])
def lt_outcome(tag: str, kind: str, duration: float = 0.0, countdown: float = 0.0):
    """Ends the way ``kind`` says: success, raise, retry, ignore, reject or soft."""
    from celery import current_task
    from celery.exceptions import Ignore, Reject

    req = current_task.request
    out = probe(tag, duration if kind != "soft" else 0.0, kind=kind)
    if kind == "raise":
        raise ValueError(f"boom {tag}")
    if kind == "retry" and req.retries == 0:
        raise current_task.retry(countdown=countdown, max_retries=1)
    if kind == "ignore":
        raise Ignore()
    if kind == "reject":
        raise Reject("rejected on purpose", requeue=False)
    if kind == "soft":
        time.sleep(duration)  # interrupted by SoftTimeLimitExceeded
    return out


class ForgetfulTask(LockedTask):
    """Overrides after_return without calling super(): the release's reply is then
    read at the child's next call to Redis instead (the lock is free either way)."""

    def after_return(self, *args: object, **kwargs: object) -> None:
        pass


@app.task(name="lt.forgetful", base=ForgetfulTask, on_contention="fail", lock_key=["tag"])
def lt_forgetful(tag: str):
    return probe(tag, 0.0)


@app.task(name="lt.probe_retry", base=LockedTask, on_contention="retry", lock_key=["tag"])
def lt_probe_retry(tag: str, fail: bool = False, duration: float = 0.05):
    out = probe(tag, duration, fail=fail)
    if fail:
        raise ValueError(f"failed on purpose {tag}")
    return out


@app.task(name="lt.stubborn", base=LockedTask, on_contention="fail", lock_key=["job"])
def lt_stubborn(job: str, tag: str, duration: float = 10.0):
    """Blocks SIGTERM while it runs, like a body stuck in C code: only SIGKILL ends it,
    so no ``finally`` runs in the child and only the worker's main process can free
    the lock."""
    import signal

    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        return probe(tag, duration, job=job)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _last_arg(*args: object, **kwargs: object) -> str:
    return str(args[-1])


@app.task(name="lt.self_errback", base=LockedTask, on_contention="fail", lock_key=_last_arg)
def lt_self_errback(*args: object) -> dict:
    """Sent as ``(tag,)``: fails.  Linked as its own errback (``link_error=
    lt_self_errback.s(tag)``), Celery calls it in-process as a new-style errback,
    ``(request, exc, traceback, tag)``, after the failure is stored, while the
    failed run's request is still on the task's stack (bind=False: Celery sends
    a bound task's errback as a message instead)."""
    if len(args) == 1:
        probe(str(args[0]), kind="body")
        raise ValueError(f"boom {args[0]}")
    request, exc, _traceback, tag = args
    return probe(str(tag), kind="errback", failed=getattr(request, "id", None), exc=repr(exc))


@app.task(name="lt.self_call", base=LockedTask, on_contention="fail", lock_key=["tag", "depth"])
def lt_self_call(tag: str, depth: int) -> list:
    """Calls itself directly (``lt_self_call(...)``, a plain function call in this
    process) ``depth`` levels deep; returns what each level saw of the request."""
    from celery import current_task

    req = current_task.request
    hold = getattr(req, "redislock", None)
    seen = [
        {
            "depth": depth,
            "id": req.id,
            "called_directly": req.called_directly,
            "fence": getattr(req, "lock_fence", None),
            "hold_fence": getattr(hold, "fence", None),
            "pid": os.getpid(),
            # What a retry from this level would send as headers.
            "headers": sorted(
                current_task.signature_from_request(req).options.get("headers") or {}
            ),
        }
    ]
    if depth:
        seen += lt_self_call(tag, depth - 1)
    return seen


# Receivers: what the worker's signals saw, per lock name / task id, on db 3.

#: Tasks whose task_postrun records whether their lock key still exists.
POSTRUN_TASKS = {"lt.outcome", "lt.bound", "lt.forgetful", "lt.self_errback", "lt.self_call"}


def _connect_receivers() -> None:
    from celery import signals as celery_signals

    from celery_redislock import signals as lock_signals
    from celery_redislock.primitives import keys as _keys

    def on_lock_signal(signal_name: str):
        def receiver(sender=None, request=None, name=None, **kw):
            if "sig-" not in (name or ""):
                return  # only the signal tests' locks: keep other runs fast
            recorder().rpush(
                f"sig:{name}",
                json.dumps(
                    {
                        "signal": signal_name,
                        "id": getattr(request, "id", None),
                        "fence": kw.get("fence"),
                        "holder": kw.get("holder"),
                        "policy": kw.get("policy"),
                        "key": kw.get("key"),
                        "at": time.monotonic(),
                    }
                ),
            )

        return receiver

    for sig in ("lock_acquired", "lock_contended", "lock_released", "task_skipped"):
        getattr(lock_signals, sig).connect(
            on_lock_signal(sig), weak=False, dispatch_uid=f"tests.celery_app.{sig}"
        )

    def on_retry(sender=None, request=None, reason=None, **kw):
        recorder().rpush(
            "retry_signals",
            json.dumps(
                {
                    "id": getattr(request, "id", None),
                    "task": getattr(sender, "name", None),
                    "reason": str(reason),
                }
            ),
        )

    celery_signals.task_retry.connect(on_retry, weak=False, dispatch_uid="tests.celery_app.retry")

    def on_lost(sender=None, key=None, reason=None, **kw):
        if "outage" not in (key or ""):
            return  # only the store outage tests' locks
        recorder().rpush(
            "lock_lost",
            json.dumps({"key": key, "reason": str(reason), "pid": os.getpid(), "at": time.time()}),
        )

    lock_signals.lock_lost.connect(on_lost, weak=False, dispatch_uid="tests.celery_app.lost")

    def on_postrun(sender=None, task_id=None, task=None, args=None, kwargs=None, state=None, **kw):
        if not isinstance(task, LockedTask) or task.name not in POSTRUN_TASKS:
            return
        try:
            from celery_redislock import config as _config

            name = task.lock_name_for(args or (), kwargs or {})
            key = _keys.lock_keys(_config.settings_for(task.app).key_prefix, name).lock
            value = _config.client_for(task.app).get(key)
            holder = value.decode() if value is not None else None
            error = None
        except Exception as exc:  # recorded, so the test sees it
            holder, error = None, repr(exc)
        recorder().rpush(
            f"postrun:{task_id}",
            json.dumps(
                {
                    "state": state,
                    "holder": holder,
                    "error": error,
                    "pid": os.getpid(),
                    "at": time.monotonic(),
                }
            ),
        )

    celery_signals.task_postrun.connect(
        on_postrun, weak=False, dispatch_uid="tests.celery_app.postrun"
    )


_connect_receivers()
