"""Operating the library: the ``celery redislock`` command.

- ``command.py``: the ``celery redislock`` subcommand (a ``celery.commands``
  entry point), and the worker-start hook that entry point brings.
- ``cli.py``: its ``ls``, ``show``, ``release``, ``parked`` and ``stats``
  subcommands; ``top.py``: ``top``, the live view; ``table.py``: what they
  print for people (safe cells, durations, aligned tables).
- ``web.py``: ``celery redislock web``, a page of the names in use (its files
  in ``static/``), served by the stdlib's HTTP server.
- ``metrics.py``: Prometheus metrics counted by receivers of the library's
  signals, and the worker step serving them (``redislock_metrics_port``);
  ``metrics_endpoint.py``: the registry it serves and its HTTP server.

What it may import: Celery, click, and every other layer; nothing imports it.
"""
