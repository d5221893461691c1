"""The demo: ``python -m celery_redislock.demo``.

A private redis-server (or ``REDIS_URL``), a real ``celery worker -P prefork
-c 4`` on the demo's tasks, and a scenario per contention policy and feature,
each ending in a check of what Redis recorded; the exit status says whether
every check held.

- ``config.py``: the demo app's settings (broker, results and locks on one
  Redis, three db numbers); ``tasks.py``: the app and its tasks;
  ``records.py``: what the tasks write down (start/end events, the fenced store).
- ``scenarios.py``: publish, wait, measure; ``checks.py``: a check, its line, the
  exit status; ``processes.py``: the worker and ``celery redislock``;
  ``__main__.py``: puts them together, with a private redis-server from
  :mod:`celery_redislock.testing.server` when ``REDIS_URL`` is not set.

What it may import: Celery, every layer of the library; nothing imports it.
"""
