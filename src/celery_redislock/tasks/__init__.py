"""The Celery side: LockedTask and what only it needs.

- ``locked_task.py``: the task base class (take, hold, release);
- ``hold.py``: one run's hold, released exactly once;
- ``policies.py``: what a contended run does (retry, skip, wait, fail, park);
- ``parking.py``: contended runs parked in Redis and re-published by the release;
- ``parked_state.py``: ``PARKED``, a parked run's state in Celery's result store;
- ``park_recovery.py``: parked runs a lock store lost, re-published or reported;
- ``durability.py``: whether the lock store keeps parked runs, checked at worker start;
- ``request.py``: the worker's main process frees the locks of children it kills;
- ``lock_keys.py``: ``lock_key`` compiled against the task's signature;
- ``targets.py``: which primitive guards a run (lock, semaphore, group, read/write).

What it may import: Celery, kombu, and the core (:mod:`celery_redislock.primitives`,
:mod:`celery_redislock.transport`); the core never imports this package.
"""
