"""Sphinx configuration: MyST Markdown pages, an API reference from docstrings."""

from __future__ import annotations

import sys
from pathlib import Path

# Documents the source tree, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

project = "celery_redislock"
author = "celery_redislock developers"
copyright = "celery_redislock developers"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3

autodoc_typehints = "description"
autodoc_member_order = "bysource"

# Internal types that appear in signatures and docstrings but are not part of the
# documented API (the nitpicky build, -n, names every other unresolved reference).
nitpick_ignore = [
    ("py:class", "Primitive"),
    ("py:class", "UniqueRun"),
    ("py:class", "MetricsStep"),
    ("py:class", "celery_redislock.primitives.rwlock.Side"),
    ("py:class", "celery_redislock.asyncio.rwlock.Side"),
    ("py:class", "celery_redislock.ops.metrics.Metrics"),
    ("py:class", "celery_redislock.ops.metrics_endpoint.Server"),
    ("py:mod", "celery_redislock.ops.metrics_endpoint"),
    ("py:mod", "celery_redislock.unique"),
    ("py:mod", "celery_redislock.tasks.owners"),
    # The standard library's, without intersphinx (no network at build time).
    ("py:class", "collections.abc.Iterator"),
    ("py:class", "collections.abc.Sequence"),
    # Relative references of docstrings written for the source reader.
    ("py:class", "RedisServer"),
    ("py:class", "Mode"),
    ("py:class", "LockKeys"),
    ("py:class", "MultiKeys"),
    ("py:attr", "fence"),
    ("py:mod", "reading"),
    ("py:func", "release"),
]

try:
    import furo  # noqa: F401
except ImportError:  # the default theme when furo is not installed
    html_theme = "alabaster"
else:
    html_theme = "furo"
html_title = "celery_redislock"


def _field_list(app, what, name, obj, options, lines):  # type: ignore[no-untyped-def]
    """Settings' docstring lists its fields as ``name: text`` (read in the source, and
    in the same order as the settings table): give each a line of its own."""
    if not name.endswith("config.Settings"):
        return
    out = []
    for line in lines:
        head, sep, rest = line.partition(": ")
        if sep and head.isidentifier() and not line.startswith(" "):
            out += ["", f"``redislock_{head}``", f"    {rest}"]
        else:
            out.append(line)
    lines[:] = [*out, ""]


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("autodoc-process-docstring", _field_list)
