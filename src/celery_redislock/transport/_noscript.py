"""A script the server does not know (NOSCRIPT), loaded and its calls sent once more.

Script calls go out as EVALSHA, which a restarted, flushed or failed-over
server answers with NOSCRIPT and runs nothing.  Every way a call is sent (a
pooled round trip, a reply read later, a pipeline, ``execute_command``)
goes through :func:`loaded`: the calls that came back NOSCRIPT have their
scripts loaded on the server they went to, and are sent once more, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

from redis.exceptions import NoScriptError

__all__ = ["loaded", "loaded_one"]

#: Script is a redis-py ``Script`` (or anything with ``sha`` and ``script``).
Script = Any


def loaded(
    send: Callable[[list[int]], list[Any]],
    scripts: Sequence[Script],
    load: Callable[[Script], Any],
    first: Optional[list[Any]] = None,
) -> list[Any]:
    """The replies of the calls ``send`` makes, one per script of ``scripts``.

    ``send(indexes)`` sends the calls at those indexes and returns their
    replies in order, a NOSCRIPT reply as its :class:`NoScriptError` (other
    errors as ``send`` has them).  ``first``: the replies of a send already
    made.  Those that came back NOSCRIPT: ``load(script)`` on the server they
    went to (each script once), then ``send`` once more for just those calls.
    """
    replies = send(list(range(len(scripts)))) if first is None else first
    unknown = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if not unknown:
        return replies
    for script in {scripts[i].sha: scripts[i] for i in unknown}.values():
        load(script)
    replies = list(replies)
    for i, reply in zip(unknown, send(unknown)):
        replies[i] = reply
    return replies


def loaded_one(
    send: Callable[[], Any],
    script: Script,
    load: Callable[[Script], Any],
    first: Optional[NoScriptError] = None,
) -> Any:
    """:func:`loaded` for one call whose ``send()`` raises its error replies
    (``first``: the NOSCRIPT a send already made got): its reply, or the
    error of the last send raised."""

    def listed(_: list[int]) -> list[Any]:
        try:
            return [send()]
        except NoScriptError as exc:
            return [exc]

    [reply] = loaded(listed, [script], load, None if first is None else [first])
    if isinstance(reply, NoScriptError):
        raise reply
    return reply
