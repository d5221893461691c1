"""Run the demo: ``python -m celery_redislock.demo``, under its old name.

    python examples/quickstart/run.py
    REDIS_URL=redis://127.0.0.1:6379/0 python examples/quickstart/run.py

The scenarios, their tasks and their checks live in the package
(``celery_redislock.demo``), so that ``pip install 'celery-redislock[demo]'``
is all the demo needs; this file only runs it.
"""

from celery_redislock.demo.__main__ import main

if __name__ == "__main__":
    main()
