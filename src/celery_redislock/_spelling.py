"""How a user spelled a setting, and what a misspelt name probably meant.

Celery finds ``redislock_lock_ttl`` under that name, its upper-case form, or
with the app's namespace (``CELERY_REDISLOCK_LOCK_TTL`` after
``config_from_object(..., namespace="CELERY")``, as Django projects do).
Errors name a setting the way the user wrote it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from typing import Any, Optional

__all__ = ["closest", "keys_like", "spelled", "suggestion"]


def _prefix(conf: Any) -> str:
    prefix = getattr(conf, "prefix", None)
    return prefix.upper() if isinstance(prefix, str) else ""


def _canonical(key: str, prefix: str) -> str:
    """``CELERY_REDISLOCK_LOCK_TTL`` -> ``redislock_lock_ttl`` (with that prefix)."""
    if prefix and key.upper().startswith(prefix):
        key = key[len(prefix) :]
    return key.lower()


def spelled(conf: Any, name: str) -> str:
    """How ``conf`` holds setting ``name`` (``name`` itself when it is not set)."""
    prefix = _prefix(conf)
    candidates = [f"{prefix}{name.upper()}"] if prefix else []
    candidates += [name, name.upper()]
    keys = set(_keys(conf))
    return next((k for k in candidates if k in keys), name)


def keys_like(conf: Any, start: str) -> Iterator[tuple[str, str]]:
    """(as written, canonical) of every key of ``conf`` whose canonical form
    starts with ``start``."""
    prefix = _prefix(conf)
    for key in _keys(conf):
        if isinstance(key, str):
            name = _canonical(key, prefix)
            if name.startswith(start):
                yield key, name


def _keys(conf: Any) -> Iterable[Any]:
    try:
        return list(conf.keys())
    except AttributeError:  # pragma: no cover - not a mapping
        return []


def closest(name: str, valid: Iterable[str], cutoff: float = 0.6) -> Optional[str]:
    """The valid name ``name`` was most likely meant to be, if any is close."""
    match = difflib.get_close_matches(name, list(valid), n=1, cutoff=cutoff)
    return match[0] if match else None


def suggestion(name: str, valid: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` or a list of the valid names."""
    valid = sorted(valid)
    best = closest(name, valid)
    if best is not None:
        return f"; did you mean {best!r}?"
    return f"; valid names: {', '.join(valid)}"
