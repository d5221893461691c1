"""Finishing what must not be left half done when the caller is cancelled.

A release that is cancelled after it was sent may or may not have run; one
cancelled before it was sent has not.  Either way the caller would be left
not knowing whether it still holds the lock, and nobody would release it.
So the clean-up of an acquire that will not return True runs in a task of its
own, shielded (:func:`complete`): a cancellation of the caller waits for that
task to finish, then goes on; a second cancellation stops the waiting (the
task still finishes, in the background).  A release is awaited directly, a
task costing more than its own Python work; when a cancellation cuts it short
it is sent again in such a task (:func:`finish_after_cancel`), which is safe
because the release script releases a token's hold once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["cancel_requested", "complete", "finish_after_cancel"]

T = TypeVar("T")

#: Tasks left to finish on their own after their caller was cancelled twice
#: (the event loop keeps only weak references to tasks).
_finishing: set[asyncio.Future[Any]] = set()


async def complete(work: Coroutine[Any, Any, T]) -> T:
    """``await work``, which runs to its end even if the caller is cancelled:
    the caller's cancellation is raised once ``work`` is over (whatever its
    outcome), or at once on a second cancellation."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await _see_through(task)
        raise


async def finish_after_cancel(work: Coroutine[Any, Any, Any]) -> None:
    """Run ``work`` to its end in a task of its own, for a caller that was
    just cancelled: the caller waits for it (then raises its cancellation), or
    stops waiting on a second cancellation (``work`` still finishes).  Its
    outcome is not the caller's: the caller was cancelled."""
    await _see_through(asyncio.ensure_future(work))


async def _see_through(task: asyncio.Future[Any]) -> None:
    """Wait for ``task`` on behalf of a caller that was cancelled; a second
    cancellation stops the waiting, and ``task`` is kept to finish alone."""
    if not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                _finishing.add(task)
                task.add_done_callback(_finished)
                raise
        except Exception:  # its outcome is not the caller's to see: it was cancelled
            pass
    _finished(task)


def _finished(task: asyncio.Future[Any]) -> None:
    _finishing.discard(task)
    if not task.cancelled():
        task.exception()  # (retrieved: asyncio would report it as never retrieved)


def cancel_requested() -> int:
    """How many cancellations of the running task are pending: ones not yet
    answered, or lost on their way (always 0 before Python 3.11, which does not
    count them)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return int(cancelling()) if cancelling is not None else 0
