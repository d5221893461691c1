"""The docs' option and settings tables match the code: every task option and every
``redislock_*`` setting has one row, no row names something that does not exist, and
each default shown is the code's."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

from celery_redislock import config
from celery_redislock.tasks import options

PAGE = Path(__file__).resolve().parents[2] / "docs" / "options.md"
ROW = re.compile(r"^\| `([a-z_]+)` \| (.*) \|$")
#: The table's "no default" cell.
NONE = "\N{EN DASH}"


def _table(heading: str) -> dict[str, list[str]]:
    """The rows of the table under ``## heading``: first cell -> the other cells."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            assert match[1] not in rows, f"{match[1]} has two rows in {PAGE.name}"
            rows[match[1]] = [cell.strip() for cell in match[2].split(" | ")]
    return rows


def _default(f):  # type: ignore[no-untyped-def]
    return f.default_factory() if f.default is MISSING else f.default


def test_every_task_option_has_one_row_and_only_those() -> None:
    rows = _table("Task options")
    assert set(options.VALID) - set(rows) == set(), "options missing from the docs"
    assert set(rows) - set(options.VALID) == set(), "documented options that do not exist"


def test_task_option_defaults_name_their_setting() -> None:
    rows = _table("Task options")
    for option, field_name in options.OPTIONS.items():
        assert rows[option][-1] == f"`redislock_{field_name}`", option


def test_every_setting_has_one_row_with_its_default() -> None:
    rows = _table("Settings (`app.conf`)")
    expected = {f"redislock_{f.name}": f"`{_default(f)!r}`" for f in fields(config.Settings)}
    expected.update(dict.fromkeys(config.OTHER_KEYS, NONE))
    assert set(expected) - set(rows) == set(), "settings missing from the docs"
    assert set(rows) - set(expected) == set(), "documented settings that do not exist"
    for setting, default in expected.items():
        assert rows[setting][0] == default, setting


def test_settings_are_listed_in_the_order_of_their_fields() -> None:
    rows = list(_table("Settings (`app.conf`)"))
    assert rows[: len(fields(config.Settings))] == [
        f"redislock_{f.name}" for f in fields(config.Settings)
    ]
