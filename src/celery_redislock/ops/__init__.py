"""Operating the library: the ``celery redislock`` command.

- ``command.py``: the ``celery redislock`` subcommand (a ``celery.commands``
  entry point), and the worker-start hook that entry point brings.

What it may import: Celery, click, and every other layer; nothing imports it.
"""
