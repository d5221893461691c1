"""Which unique-job policy a publish follows, and the checks of its options.

Pure decisions, no Redis and no Celery.  The options, in the order the
unique-jobs page (docs/unique.md) lists them:

- ``unique``: ``"until_started"``, ``"until_finished"`` or ``"coalesce"``
  (None: no uniqueness);
- ``unique_key``: which arguments make two jobs the same (default: those of
  ``lock_key``); checked against the task's signature by the task side;
- ``unique_ttl``: the longest a waiting job holds its key (default
  ``redislock_unique_ttl``), plus its countdown or ETA;
- ``on_duplicate``: ``"return"``, ``"raise"`` or ``"replace"`` (default
  ``redislock_on_duplicate``);
- ``debounce``: seconds each publish waits; a later one supersedes it;
- ``throttle``: seconds during which one publish per key is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from .. import _validate
from ..exceptions import ConfigurationError

__all__ = [
    "CALL_OPTIONS",
    "MODES",
    "ON_DUPLICATE",
    "OPTIONS",
    "Policy",
    "check_guard",
    "check_option",
    "resolve",
]

#: ``unique`` values, and the letter the scripts know each by.
MODES = {"until_started": "s", "until_finished": "f", "coalesce": "c"}
ON_DUPLICATE = ("return", "raise", "replace")
#: Every unique-job option of a task.
OPTIONS = ("unique", "unique_key", "unique_ttl", "on_duplicate", "debounce", "throttle")
#: Those that may also be given per call (``apply_async(redislock={...})``).
CALL_OPTIONS = ("unique", "unique_ttl", "on_duplicate", "debounce", "throttle")


def check_option(option: str, value: Any, where: str) -> None:
    """Check one unique-job option's value on its own; ``where`` names it."""
    if option == "unique":
        if value is not None:
            _validate.check_choice(value, where, MODES)
    elif option == "on_duplicate":
        if value is not None:
            _validate.check_choice(value, where, ON_DUPLICATE)
    elif option in ("unique_ttl", "debounce", "throttle"):
        _validate.check_seconds(value, where, optional=True)


@dataclass(frozen=True)
class Policy:
    """The unique-job policy of one publish, every default applied."""

    #: ``unique`` as the user wrote it, or None (a throttle alone).
    unique: Optional[str]
    #: Seconds a waiting job holds its key (before its countdown is added).
    ttl: float
    on_duplicate: str
    debounce: Optional[float] = None
    throttle: Optional[float] = None

    @property
    def mode(self) -> str:
        """The scripts' letter for ``unique`` ('-' for a throttle alone)."""
        return MODES[self.unique] if self.unique is not None else "-"

    @property
    def replaces(self) -> bool:
        """Whether a publish supersedes the job waiting under its key."""
        return self.on_duplicate == "replace"


def resolve(
    task_name: str, values: Mapping[str, Any], ttl: float, on_duplicate: str
) -> Optional[Policy]:
    """The policy of a publish from its option ``values`` (per call over task
    attributes; None where unset), with the settings' defaults ``ttl`` and
    ``on_duplicate``; None when the publish is not unique at all.

    Raises ConfigurationError for a combination without meaning.
    """
    unique = values.get("unique")
    debounce = values.get("debounce")
    throttle = values.get("throttle")
    if unique is None and debounce is None and throttle is None:
        return None
    check_combination(task_name, values)
    explicit = values.get("on_duplicate")
    if debounce is not None:
        unique = unique or "until_started"
        explicit = "replace"
    chosen = explicit or on_duplicate
    if chosen == "replace" and (unique == "coalesce" or unique is None):
        chosen = "return"  # (a setting's default: only explicit values are refused)
    return Policy(
        unique=unique,
        ttl=float(values.get("unique_ttl") or ttl),
        on_duplicate=chosen,
        debounce=None if debounce is None else float(debounce),
        throttle=None if throttle is None else float(throttle),
    )


def check_combination(task_name: str, values: Mapping[str, Any]) -> None:
    """Refuse options that exclude each other (explicit values only)."""
    where = f"task {task_name!r}: option"
    unique = values.get("unique")
    on_duplicate = values.get("on_duplicate")
    debounce = values.get("debounce")
    throttle = values.get("throttle")
    if debounce is not None and throttle is not None:
        raise ConfigurationError(
            f"{where}s debounce={debounce!r} and throttle={throttle!r} exclude each other: "
            "debounce runs the last publish of a burst, throttle the first; choose one"
        )
    if on_duplicate == "replace" and unique == "coalesce":
        raise ConfigurationError(
            f"{where} on_duplicate='replace' has no meaning with unique='coalesce', which "
            "keeps the waiting job and refuses the new one; use unique='until_started' "
            "with a run lock on the same key to replace it"
        )
    if on_duplicate == "replace" and unique is None and debounce is None:
        raise ConfigurationError(
            f"{where} on_duplicate='replace' needs unique='until_started' or "
            f"'until_finished': a throttle ({throttle!r} s) refuses, it has nothing to replace"
        )
    if debounce is not None:
        if unique == "coalesce":
            raise ConfigurationError(
                f"{where} debounce={debounce!r} replaces the waiting job, which "
                "unique='coalesce' keeps; use unique='until_started' (the default with debounce)"
            )
        if on_duplicate not in (None, "replace"):
            raise ConfigurationError(
                f"{where} on_duplicate={on_duplicate!r} conflicts with debounce={debounce!r}, "
                "which always replaces the waiting job (on_duplicate='replace')"
            )


def check_guard(
    task_name: str,
    unique: Any,
    unique_key: Any,
    lock_key: Any,
    semaphore: Any,
    concurrency_group: Any,
    lock_mode: Any,
) -> None:
    """``coalesce`` promises one job waiting and one running per key: the run
    lock gives the "one running", so it must be a mutex over the same key."""
    if unique != "coalesce":
        return
    where = f"task {task_name!r}: option unique='coalesce'"
    if unique_key is not None and unique_key != lock_key:
        raise ConfigurationError(
            f"{where} keeps one job running per key through the run's lock, so the key "
            f"is lock_key's: set lock_key={unique_key!r} instead of unique_key"
        )
    guard = (
        ("semaphore", semaphore),
        ("concurrency_group", concurrency_group),
        ("lock_mode", lock_mode if lock_mode == "read" else None),
    )
    for option, value in guard:
        if value is not None:
            raise ConfigurationError(
                f"{where} needs a run lock that one job holds at a time, "
                f"not {option}={value!r}; use unique='until_started'"
            )
