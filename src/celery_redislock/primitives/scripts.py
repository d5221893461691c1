"""Loads the Lua scripts in ``lua/`` once, as redis-py Script objects.

A line ``-- include: NAME`` in a script is replaced by ``lua/NAME.lua``, so
shared helpers live in one file.  Lua defines a script's local functions
each time it runs, so a script may answer its common case in a few lines
above the include and only define the helpers when it needs them.  The
transport sends a script by its sha and loads it on NOSCRIPT.
"""

from __future__ import annotations

import functools
from importlib import resources

from redis.commands.core import Script

__all__ = ["get", "source"]


@functools.cache
def source(name: str) -> str:
    """The full text of script ``name``, with its includes resolved."""
    text = (
        resources.files("celery_redislock.primitives")
        .joinpath("lua", f"{name}.lua")
        .read_text("utf-8")
    )
    return "\n".join(
        source(line.split(":", 1)[1].strip()) if line.startswith("-- include:") else line
        for line in text.split("\n")
    )


@functools.cache
def get(name: str) -> Script:
    """The Script object for ``lua/<name>.lua``, shared by every client."""
    # Bytes, so the Script needs no client to compute its sha.
    return Script(None, source(name).encode("utf-8"))  # type: ignore[arg-type]
