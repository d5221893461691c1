"""The demo's tasks, for a worker of your own (docker/ runs two of these):

    cd examples/quickstart
    REDIS_URL=redis://127.0.0.1:6379/0 celery -A tasks worker -P prefork -c 4

They live in the package, ``celery_redislock.demo.tasks`` (what each shows is
in its docstring); ``celery -A celery_redislock.demo.tasks worker`` is the same.
"""

from celery_redislock.demo.tasks import app

__all__ = ["app"]
