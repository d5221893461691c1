"""What the start-up ERROR says locked runs will do while the store is unreachable:
the app's lock_on_redis_error in words, and the tasks that set their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_redislock import LockedTask, config
from celery_redislock.tasks.store_check import what_runs_do


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("store-check", set_as_current=False)
    app.conf.update(redislock_url="redis://127.0.0.1:1/0", redislock_redis_error_retries=3)
    yield app
    app.close()


def test_the_apps_policy_and_the_tasks_of_their_own(app: Celery) -> None:
    @app.task(name="sc.default", base=LockedTask, shared=False)
    def default() -> None: ...

    @app.task(name="sc.strict", base=LockedTask, shared=False, lock_on_redis_error="fail")
    def strict() -> None: ...

    @app.task(name="sc.patient", base=LockedTask, shared=False, lock_redis_error_retries=50)
    def patient() -> None: ...

    app.finalize()
    said = what_runs_do(app, config.settings_for(app))
    assert said.startswith(
        "each run of a locked task is re-sent up to 3 times, 1-30 s apart, then fails with "
        "BackendUnavailable (redislock_on_redis_error='retry'); but "
    ), said
    assert "sc.strict fails at once with BackendUnavailable" in said
    assert "sc.patient is re-sent up to 50 times" in said
    assert "sc.default" not in said


@pytest.mark.parametrize(
    ("policy", "retries", "words"),
    [
        ("fail", 10, "each run of a locked task fails at once with BackendUnavailable"),
        ("run", 10, "each run of a locked task runs its body WITHOUT a lock"),
        ("retry", None, "each run of a locked task is re-sent, 1-30 s apart, with no limit"),
    ],
)
def test_each_policy_in_words(app: Celery, policy: str, retries: object, words: str) -> None:
    app.conf.update(redislock_on_redis_error=policy, redislock_redis_error_retries=retries)
    app.finalize()
    assert what_runs_do(app, config.settings_for(app)).startswith(words)
