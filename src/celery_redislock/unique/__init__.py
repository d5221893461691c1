"""Unique jobs: the same work is not queued twice.

- ``policy.py``: the options (``unique``, ``unique_key``, ``unique_ttl``,
  ``on_duplicate``, ``debounce``, ``throttle``), their checks, and the policy
  a publish follows; pure decisions;
- ``publish.py``: a publish takes its job's key in one round trip, or a
  duplicate returns the job holding it (or raises AlreadyQueued);
- ``run.py``: a run starts and ends its job's claim in its lock's own
  script calls;
- ``sender.py``: ``send_task`` by name follows ``redislock_tasks`` too.

What it may import: Celery, the core (:mod:`celery_redislock.primitives`),
and the task side's message headers and key building
(:mod:`celery_redislock.tasks.messages`, :mod:`celery_redislock.tasks.lock_keys`);
the task side calls in here, never the other way round.
"""
