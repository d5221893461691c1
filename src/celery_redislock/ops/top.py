"""``celery redislock top``: a live view of the lock store, redrawn every second, like top(1).

A header with the counts, the oldest hold and the longest line, then one
row per hold, the longest-held first (``w``: the longest line first).
Keys are read one at a time (the terminal in cbreak mode, ``select`` on
stdin, so a refresh never waits on a key); ``q`` quits.  The terminal is
given back as it was on every way out: ``q``, Ctrl-C, SIGTERM, an error.
Without a terminal on stdin it refreshes until Ctrl-C; without one on
stdout it prints each frame after the last, with no escape sequences.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from typing import IO, Any, Optional

import click
from celery.bin.base import CeleryCommand
from redis.exceptions import RedisError

from .. import config
from ..exceptions import RedisLockError
from . import table
from .entries import Entry, Kind, Stats
from .inspect import Inspector

__all__ = ["frame", "summary", "top"]

#: Keys that change the order: the longest-held first, or the longest line first.
SORTS = {"h": "held", "w": "waiters"}
#: The widest a name is shown here (``ls`` shows it whole).
NAME_WIDTH = 40

_ALT_SCREEN, _MAIN_SCREEN = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"
_HOME, _EOL, _EOS = "\x1b[H", "\x1b[K", "\x1b[J"


def summary(s: Stats) -> list[str]:
    """Two lines: the oldest hold and the longest line (``stats`` prints them too)."""
    oldest = "oldest hold: -"
    if s.oldest is not None:
        e, h = s.oldest
        where = f" on {table.host_label(h)} pid {h.pid}" if h.hostname else ""
        oldest = (
            f"oldest hold: {e.kind.value} {table.safe(e.name)} by {table.holder_label(h)}"
            f"{where}, held {table.duration(h.held_ms)}"
        )
    longest = "longest line: -"
    line = s.longest_line
    if line is not None:
        longest = (
            f"longest line: {line.kind.value} {table.safe(line.name)}, "
            f"{line.waiters} waiting, {line.parked} parked"
        )
    return [oldest, longest]


def _held(e: Entry) -> int:
    return max((h.held_ms or 0 for h in e.holders), default=0)


def _order(entries: list[Entry], sort: str) -> list[Entry]:
    kinds = list(Kind)

    def key(e: Entry) -> tuple[int, int, int, str]:
        held, line = _held(e), e.waiters + e.parked
        first, second = (held, line) if sort == "held" else (line, held)
        return (-first, -second, kinds.index(e.kind), e.name)

    return sorted(entries, key=key)


def _clip(s: str, columns: int) -> str:
    """``s`` cut to ``columns`` terminal columns."""
    if table.width(s) <= columns:
        return s
    out, used = [], 0
    for c in s:
        w = table.width(c)
        if used + w > columns - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + "…"


def frame(
    ins: Inspector, title: str, sort: str, pattern: str, size: Optional[os.terminal_size]
) -> list[str]:
    """The lines of one screen: the header and as many rows as fit ``size``
    (every row, uncut, without a size: the output is no terminal)."""
    entries = ins.entries(pattern)
    s = ins.stats(entries)
    counts = "  ".join(f"{k} {s.counts[k]} ({s.held[k]} held)" for k in s.counts)
    header = [
        f"{title} - {time.strftime('%H:%M:%S')} - by {sort} (q quit, h held, w waiters)",
        f"names: {counts}",
        f"holders {s.holders}  waiters {s.waiters}  parked {s.parked}",
        *summary(s),
        "",
    ]
    rows = []
    for e in _order(entries, sort):
        for row in table.entry_rows(e):
            rows.append((row[0], _clip(row[1], NAME_WIDTH), *row[2:]))
    room = len(rows) if size is None else max(1, size.lines - len(header) - 1)
    more = len(rows) - room
    if more > 0:
        rows = rows[: room - 1]
    lines = header + table.render(table.COLUMNS, rows)
    if more > 0:
        lines.append(f"... {more + 1} more (celery redislock ls)")
    return lines if size is None else [_clip(line, size.columns) for line in lines]


class _Screen:
    """The terminal while the view runs: cbreak stdin, the alternate screen;
    given back on exit."""

    def __init__(self, stdin: IO[str], stdout: IO[str]) -> None:
        self.stdin, self.stdout = stdin, stdout
        self.keys = stdin.isatty()
        self.tty = stdout.isatty()
        self._saved: Any = None

    @contextlib.contextmanager
    def opened(self) -> Iterator[_Screen]:
        import termios  # (here: POSIX only, and the other commands work without)
        import tty

        fd = self.stdin.fileno() if self.keys else -1
        old_term = signal.getsignal(signal.SIGTERM)
        try:
            if self.keys:
                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
            if self.tty:
                self.stdout.write(_ALT_SCREEN)
                self.stdout.flush()
            # SIGTERM ends the view like Ctrl-C: the finally below restores the terminal.
            signal.signal(signal.SIGTERM, _interrupt)
            yield self
        finally:
            signal.signal(signal.SIGTERM, old_term)
            if self.tty:
                self.stdout.write(_MAIN_SCREEN)
                self.stdout.flush()
            if self._saved is not None:
                termios.tcsetattr(fd, termios.TCSADRAIN, self._saved)

    def draw(self, lines: list[str]) -> None:
        if self.tty:
            self.stdout.write(_HOME + "".join(line + _EOL + "\n" for line in lines[:-1]))
            self.stdout.write(lines[-1] + _EOL + _EOS if lines else _EOS)
        else:
            self.stdout.write("\n".join(lines) + "\n\n")
        self.stdout.flush()

    def key(self, timeout: float) -> Optional[str]:
        """A key pressed within ``timeout`` seconds, or None."""
        if not self.keys:
            time.sleep(timeout)
            return None
        fd = self.stdin.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return None
        data = os.read(fd, 1)
        if not data:  # (the terminal is gone)
            raise KeyboardInterrupt
        return data.decode("latin-1")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run(
    ins: Inspector,
    title: str,
    interval: float,
    pattern: str = "*",
    stdin: Optional[IO[str]] = None,
    stdout: Optional[IO[str]] = None,
) -> None:
    """Redraw every ``interval`` seconds until ``q`` (KeyboardInterrupt on Ctrl-C)."""
    sort = "held"
    screen = _Screen(stdin or sys.stdin, stdout or sys.stdout)
    with screen.opened():
        while True:
            size = shutil.get_terminal_size() if screen.tty else None
            try:
                lines = frame(ins, title, sort, pattern, size)
            except (RedisError, RedisLockError) as exc:
                # Kept on screen and tried again: a live view outlives a blip.
                lines = [title, f"lock store: {exc}"]
            screen.draw(lines)
            deadline = time.monotonic() + interval
            while (left := deadline - time.monotonic()) > 0:
                pressed = screen.key(left)
                if pressed in ("q", "Q"):
                    return
                if pressed in SORTS:
                    sort = SORTS[pressed]
                    break


@click.command(cls=CeleryCommand)
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True)
@click.option("--pattern", default="*", metavar="GLOB", help="Names matching this glob.")
@click.pass_context
def top(ctx: Any, interval: float, pattern: str) -> None:
    """A live view of the holds, redrawn every INTERVAL seconds; q quits."""
    app = ctx.obj.app
    try:
        ins = Inspector.from_app(app)
        store = config.describe_store(config.settings_for(app))
    except RedisLockError as exc:
        raise click.ClickException(f"lock store: {exc}") from exc
    title = f"redislock top - {table.safe(store)} prefix {table.safe(ins.prefix)}"
    with contextlib.suppress(KeyboardInterrupt):
        run(ins, title, interval, pattern)
