"""Loads the Lua scripts in ``lua/`` once and exposes them as redis-py Scripts.

A line ``-- include: NAME`` in a script is replaced by ``lua/NAME.lua``, so
shared helpers live in one file.  Lua defines a script's local functions
each time it runs, so a script may answer its common case in a few lines
above the include and only define the helpers when it needs them.  Scripts are called with
``script(keys=..., args=..., client=...)``; redis-py sends EVALSHA and falls
back to SCRIPT LOAD on NOSCRIPT, so a warm call is one round trip.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

__all__ = ["evalsha_in_pipeline", "get", "source"]


@functools.cache
def source(name: str) -> str:
    """The full text of script ``name``, with its include resolved."""
    text = resources.files("celery_redislock").joinpath("lua", f"{name}.lua").read_text("utf-8")
    return "\n".join(
        source(line.split(":", 1)[1].strip()) if line.startswith("-- include:") else line
        for line in text.split("\n")
    )


@functools.cache
def get(name: str) -> Script:
    """The Script object for ``lua/<name>.lua``, shared by every client."""
    # Bytes, so the Script needs no client to compute its sha.
    return Script(None, source(name).encode("utf-8"))  # type: ignore[arg-type]


def evalsha_in_pipeline(pipe: Any, script: Script, keys: list[str], args: list[Any]) -> None:
    """Queue ``script`` on ``pipe`` as a bare EVALSHA.

    Calling a Script on a redis-py pipeline makes ``execute()`` send SCRIPT
    EXISTS first, one extra round trip every time.  Callers queue bare
    EVALSHAs instead and handle NOSCRIPT themselves (see :func:`is_noscript`).
    """
    pipe.evalsha(script.sha, len(keys), *keys, *args)


def is_noscript(result: object) -> bool:
    return isinstance(result, NoScriptError)
