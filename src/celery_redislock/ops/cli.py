"""``celery redislock ls|show|release|parked|stats``: look at the lock store, and clear it.

Each command reads the app's lock store and key prefix (see
:meth:`Inspector.from_app`) and prints an aligned table for people, or
with ``--json`` the stable schemas of the inspect API's ``as_dict()``
(:mod:`.entries`): ``ls`` a list, the others an object.  ``release``
shows what it will free and asks first (``--yes`` skips the question);
it frees the holds it showed, by their tokens, never a hold taken since.

Exit status: 0 done; 1 when the name or parked run is not found, the
question is answered no, or the lock store cannot be reached (a message
on stderr); 2 for a usage error (click's).

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any, Optional

import click
from celery.bin.base import CeleryCommand
from redis.exceptions import RedisError

from ..exceptions import RedisLockError
from . import table, top
from .clearing import Released
from .entries import Entry, Kind, ParkedRun
from .inspect import Inspector

__all__ = ["COMMANDS"]

_KINDS = [k.value for k in Kind]
_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
_kind_option = click.option("--kind", type=click.Choice(_KINDS), help="Only this kind.")


@contextlib.contextmanager
def _store() -> Iterator[None]:
    """A missing setting or an unreachable store ends the command with status 1."""
    try:
        yield
    except (RedisError, RedisLockError) as exc:
        raise click.ClickException(f"lock store: {exc}") from exc


def inspector(ctx: Any) -> Inspector:
    """The inspector of the command's app (``celery -A proj``)."""
    with _store():
        return Inspector.from_app(ctx.obj.app)


def _json(ctx: Any, data: Any) -> None:
    # ensure_ascii: names are user data; escaped, they cannot reach the terminal raw.
    ctx.obj.echo(json.dumps(data, indent=2))


def _missing(ctx: Any, message: str) -> None:
    ctx.obj.error(message)
    ctx.exit(1)


def _lines(ctx: Any, lines: list[str], err: bool = False) -> None:
    for line in lines:
        (ctx.obj.error if err else ctx.obj.echo)(line)


def _runs_of(ins: Inspector, entries: list[Entry]) -> list[ParkedRun]:
    """The parked runs in the lines of ``entries``, line by line."""
    wanted = {(e.name, e.kind) for e in entries if e.kind is not Kind.UNIQUE and e.parked}
    runs: list[ParkedRun] = []
    for name in dict.fromkeys(n for n, _ in wanted):
        runs += [r for r in ins.parked(name) if (r.name, r.kind) in wanted]
    return runs


# -- ls ------------------------------------------------------------------------


@click.command(cls=CeleryCommand)
@_json_option
@click.option("--pattern", default="*", metavar="GLOB", help="Names matching this glob.")
@click.option("--kind", type=click.Choice([*_KINDS, "parked"]), help="Only this kind.")
@click.pass_context
def ls(ctx: Any, as_json: bool, pattern: str, kind: Optional[str]) -> None:
    """List the locks, semaphores, read-write locks and unique keys in use,
    one row per hold (--kind parked: the parked runs)."""
    ins = inspector(ctx)
    with _store():
        if kind == "parked":
            runs = _runs_of(ins, ins.entries(pattern))
            if as_json:
                _json(ctx, [r.as_dict() for r in runs])
            elif runs:
                _lines(ctx, table.render(table.PARKED_COLUMNS, table.parked_rows(runs)))
            else:
                ctx.obj.echo("no parked runs")
            return
        entries = ins.entries(pattern, kind)
    if as_json:
        _json(ctx, [e.as_dict() for e in entries])
    elif entries:
        rows = [row for e in entries for row in table.entry_rows(e)]
        _lines(ctx, table.render(table.COLUMNS, rows))
    else:
        ctx.obj.echo("nothing in use")


# -- show ----------------------------------------------------------------------


@click.command(cls=CeleryCommand)
@click.argument("name")
@_json_option
@_kind_option
@click.pass_context
def show(ctx: Any, name: str, as_json: bool, kind: Optional[str]) -> None:
    """Show NAME: every entry of it, with its holders, waiters and parked runs."""
    ins = inspector(ctx)
    with _store():
        entries = ins.show(name, kind)
        details = [(e, ins.waiters(e), _runs_of(ins, [e])) for e in entries]
    if not entries:
        _missing(ctx, f"no lock, semaphore, read-write lock or unique key named {name!r}")
    if as_json:
        shown = [
            {
                **e.as_dict(),
                "line": {
                    "waiters": [w.as_dict() for w in waiters],
                    "parked": [r.as_dict() for r in runs],
                },
            }
            for e, waiters, runs in details
        ]
        _json(ctx, {"name": name, "entries": shown})
        return
    for i, (e, waiters, runs) in enumerate(details):
        _lines(ctx, ([""] if i else []) + table.show_lines(e, waiters, runs))


# -- release -------------------------------------------------------------------


def _unique_jobs(entry: Entry) -> list[str]:
    u = entry.unique
    return [j for j in (u.waiting, u.running, u.throttled_by) if j] if u else []


def _plan(entries: list[Entry], holder: Optional[str]) -> list[tuple[Entry, list[Any]]]:
    """What to free per entry: its holds' (or a unique key's jobs') that match ``holder``."""
    plan = []
    for e in entries:
        if e.kind is Kind.UNIQUE:
            targets: list[Any] = [j for j in _unique_jobs(e) if holder in (None, j)]
        else:
            targets = [h for h in e.holders if holder in (None, h.token, h.task_id)]
        if targets:
            plan.append((e, targets))
    return plan


def _release(ins: Inspector, entry: Entry, targets: list[Any], whole: bool) -> Released:
    """Free the holds of ``entry`` the operator was shown, one token at a time
    (a hold taken since is left alone); one release for a whole unique key."""
    done: list[Released] = []
    if entry.kind is Kind.UNIQUE and whole:
        done += ins.release(entry.name, entry.kind)
    elif entry.kind is Kind.UNIQUE:
        for job in targets:
            done += ins.release(entry.name, entry.kind, holder=job)
    else:
        for h in targets:
            done += ins.release(entry.name, entry.kind, holder=h.token)
    fences = [r.fence for r in done if r.fence is not None]
    return Released(
        entry.kind,
        entry.name,
        max(fences) if fences else None,
        tuple(h for r in done for h in r.freed),
        next((r.unique_job for r in done if r.unique_job), None),
    )


def _released_line(entry: Entry, r: Released) -> str:
    name = table.safe(entry.name)
    if r.kind is Kind.UNIQUE:
        job = f"job [{table.safe(r.unique_job)}] let go" if r.unique_job else "no job held it"
        return f"released unique {name}: {job}"
    freed = ", ".join(table.holder_label(h) for h in r.freed) or "nothing (the hold ended)"
    was = entry.fence if entry.fence is not None else "-"
    return f"released {r.kind.value} {name}: freed {freed}; new fence {r.fence} (was {was})"


@click.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_kind_option
@click.option("--holder", metavar="TOKEN_OR_TASK_ID", help="Only this hold (or unique job).")
@_json_option
@click.pass_context
def release(
    ctx: Any, name: str, yes: bool, kind: Optional[str], holder: Optional[str], as_json: bool
) -> None:
    """Free NAME (a stuck lock): shows its holds, asks, frees them and raises
    the fence, so the old holder's fenced writes and release are refused."""
    ins = inspector(ctx)
    with _store():
        entries = ins.show(name, kind)
    if not entries:
        _missing(ctx, f"no lock, semaphore, read-write lock or unique key named {name!r}")
    plan = _plan(entries, holder)
    if not plan:
        if holder is not None:
            _missing(ctx, f"no holder {holder!r} of {name!r}")
        ctx.obj.echo(f"nothing holds {table.safe(name)}: nothing to release")
        return
    rows = []
    for e, targets in plan:
        if e.kind is Kind.UNIQUE:  # (its rows are its live jobs, in that order)
            rows += [r for j, r in zip(_unique_jobs(e), table.entry_rows(e)) if j in targets]
        else:
            by_token = {h.token for h in targets}
            rows += [r for h, r in zip(e.holders, table.entry_rows(e)) if h.token in by_token]
    count = len(rows)
    _lines(ctx, [f"will release {count} hold(s):"], err=as_json)
    _lines(ctx, table.render(table.COLUMNS, rows, indent="  "), err=as_json)
    if not yes:
        click.confirm(f"Release {count} hold(s) of {table.safe(name)}?", abort=True, err=as_json)
        if not sys.stdin.isatty():
            click.echo(err=as_json)  # (the answer read from a pipe was not echoed)
    with _store():
        done = [(e, _release(ins, e, targets, holder is None)) for e, targets in plan]
    if as_json:
        _json(ctx, {"name": name, "released": [r.as_dict() for _, r in done]})
    else:
        _lines(ctx, [_released_line(e, r) for e, r in done])


# -- parked --------------------------------------------------------------------


class _ParkedGroup(click.Group):
    """``parked [NAME]``, ``parked drop ID``, ``parked republish ID``: a first
    word that is no subcommand is a NAME for ``parked ls`` (``parked ls drop``
    lists the runs of a name spelled ``drop``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["ls", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_ParkedGroup)
def parked() -> None:
    """The parked runs (on_contention="park"): parked [NAME], parked drop ID,
    parked republish ID.  ID is a run's id as listed, or its task id."""


@parked.command(name="ls", cls=CeleryCommand)
@click.argument("name", required=False)
@_json_option
@click.pass_context
def parked_ls(ctx: Any, name: Optional[str], as_json: bool) -> None:
    """List the parked runs (of NAME), in line order."""
    ins = inspector(ctx)
    with _store():
        if name is not None and not ins.show(name):
            _missing(ctx, f"no lock, semaphore or read-write lock named {name!r}")
        runs = ins.parked(name)
    if as_json:
        _json(ctx, [r.as_dict() for r in runs])
    elif runs:
        _lines(ctx, table.render(table.PARKED_COLUMNS, table.parked_rows(runs)))
    else:
        ctx.obj.echo("no parked runs")


def _find_run(ins: Inspector, run_id: str) -> Optional[ParkedRun]:
    """The parked run whose id (or task id) is ``run_id``."""
    return next((r for r in ins.parked() if run_id in (r.id, r.task_id)), None)


@parked.command(cls=CeleryCommand)
@click.argument("run_id", metavar="ID")
@_json_option
@click.pass_context
def drop(ctx: Any, run_id: str, as_json: bool) -> None:
    """Take parked run ID out of its line for good: it never runs."""
    ins = inspector(ctx)
    with _store():
        found = _find_run(ins, run_id)
        dropped = ins.drop_parked(found.id if found else run_id)
    if dropped is None:
        _missing(ctx, f"no parked run {run_id!r}")
        return
    if as_json:
        _json(ctx, {"dropped": dropped.as_dict()})
    else:
        task = table.task_label(dropped.task_name, dropped.task_id)
        ctx.obj.echo(
            f"dropped parked run {table.safe(dropped.id)} ({task}) "
            f"of {dropped.kind.value} {table.safe(dropped.name)}"
        )


@parked.command(cls=CeleryCommand)
@click.argument("run_id", metavar="ID")
@_json_option
@click.pass_context
def republish(ctx: Any, run_id: str, as_json: bool) -> None:
    """Publish parked run ID again now, as a new contender (it parks again if
    its lock is still held)."""
    ins = inspector(ctx)
    with _store():
        found = _find_run(ins, run_id)
        task_id = ins.republish_parked(found.id if found else run_id)
    if task_id is None:
        _missing(ctx, f"no parked run {run_id!r}")
        return
    if as_json:
        _json(ctx, {"run": found.as_dict() if found else None, "task_id": task_id})
    else:
        where = f" of {found.kind.value} {table.safe(found.name)}" if found else ""
        ctx.obj.echo(f"re-published parked run {table.safe(run_id)}{where} as task {task_id}")


# -- stats ---------------------------------------------------------------------


@click.command(cls=CeleryCommand)
@_json_option
@click.option("--pattern", default="*", metavar="GLOB", help="Names matching this glob.")
@click.pass_context
def stats(ctx: Any, as_json: bool, pattern: str) -> None:
    """Counts per kind, the oldest hold and the longest line."""
    ins = inspector(ctx)
    with _store():
        s = ins.stats(ins.entries(pattern))
    if as_json:
        _json(ctx, s.as_dict())
        return
    rows = [(k, str(s.counts[k]), str(s.held[k])) for k in _KINDS]
    lines = table.render(("KIND", "NAMES", "HELD"), rows)
    lines.append(f"holders {s.holders}, waiters {s.waiters}, parked runs {s.parked}")
    lines += top.summary(s)
    _lines(ctx, lines)


COMMANDS = [ls, show, release, parked, stats, top.top]
