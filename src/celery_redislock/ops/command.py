"""``celery -A proj redislock ...``: the library's Celery subcommand.

Celery's command line loads every ``celery.commands`` entry point as it
starts, in every ``celery`` process, this one among them (see
pyproject.toml).  That is the one hook Celery gives before a worker has
imported anything of a project: a project whose configuration sets
``redislock_tasks`` but forgot ``task_annotations = [ConfiguredLocks()]``
imports nothing of the library, and would run its tasks unlocked without a
word.  So loading this module connects (once, :func:`connect`) a
``celeryd_init`` receiver that adds the library's worker step to such an
app: the worker then refuses to start, saying what is missing.

Subcommands:

- ``check``: the settings, the lock store (reached with PING), the locked
  tasks and the patterns that lock nothing; exits non-zero on a problem.
- ``ls``, ``show``, ``release``, ``parked``, ``stats``, ``top``: what the
  lock store holds, and clearing what is stuck (see :mod:`.cli`).
- ``web``: a page listing the names in use, refreshed every second (:mod:`.web`).
"""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand, handle_preload_options
from celery.signals import celeryd_init

from .. import config
from ..exceptions import ConfigurationError
from ..tasks import configured, startup, task_rules
from . import cli, metrics
from .web import web

__all__ = ["connect", "redislock"]


@click.group(name="redislock")
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
def redislock(ctx: Any) -> None:
    """celery_redislock: the lock store, and the tasks it locks."""


@redislock.command(cls=CeleryCommand)
@click.pass_context
def check(ctx: Any) -> None:
    """Check the settings and the lock store, and list the locked tasks."""
    app = ctx.obj.app
    try:
        config.reset(app)
        settings = config.require_store(app)
        configured.check_annotated(app)
        app.finalize(auto=True)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    store = config.describe_store(settings)
    try:
        config.client_for(app).ping()
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:
        raise click.ClickException(f"lock store {store} unreachable: {exc}") from exc
    ctx.obj.echo(f"lock store: {store} (from {config.store(app.conf)[1]}), reached")
    ctx.obj.echo(f"locked tasks: {configured.describe(app)}")
    unmatched = task_rules.unmatched(app)
    for pattern in unmatched:
        ctx.obj.echo(f"{task_rules.SETTING} pattern {pattern!r} matches no registered task")
    if unmatched:
        ctx.exit(1)


redislock.add_command(web)


for _command in cli.COMMANDS:
    redislock.add_command(_command)


def _on_worker_init(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """A worker starts: an app with ``redislock_tasks`` gets the worker step,
    which checks them (and refuses to start without ConfiguredLocks); an app
    with ``redislock_metrics_port`` gets the metrics step, which serves them."""
    app = getattr(instance, "app", None)
    if app is not None and app.conf.get(task_rules.SETTING):
        app.steps["worker"].add(startup.WORKER_STEP)
    if app is not None and metrics.wanted(app):
        app.steps["worker"].add(metrics.MetricsStep)


def connect() -> None:
    """Connect the worker-start receiver (idempotent)."""
    celeryd_init.connect(_on_worker_init, weak=False, dispatch_uid="celery_redislock.ops")


# Loaded as a ``celery.commands`` entry point: the receiver must be connected
# before the worker starts, and nothing else of the library may have been
# imported by then (see the module docstring).
connect()
