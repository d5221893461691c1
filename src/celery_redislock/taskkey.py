"""Compile a task's ``lock_key`` option into a function of the call's arguments.

``lock_key`` may be None (one lock for the task), a list/tuple of parameter
names, a ``str.format`` template over the parameters, or a callable taking the
task's arguments.  Arguments are bound through the task's signature, so
positional, keyword and default values give the same key.  Values are
canonicalised as compact JSON (UUID, datetime and Decimal as their plain string forms;
other types through kombu's JSON encoder) before they become part of a
lock name.
"""

from __future__ import annotations

import datetime
import decimal
import inspect
import json
import string
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Optional

from kombu.utils.json import JSONEncoder

from .exceptions import ConfigurationError

__all__ = ["KeySpec", "canonical"]


def _plain(value: Any) -> Any:
    # Plain strings for the common non-JSON types, so lock names stay readable
    # and do not depend on kombu's tagged encoding (which can change between
    # versions during a rolling upgrade); anything else goes to kombu's encoder.
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    return JSONEncoder().default(value)


_ENCODER = json.JSONEncoder(
    default=_plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False
)


#: How the encoder above writes a str (with ensure_ascii=False).
_encode_str = json.encoder.encode_basestring


def canonical(value: Any) -> str:
    """Deterministic compact JSON of ``value`` (raises TypeError when impossible).

    UUID, Decimal and date/time values become their plain string forms.
    """
    if type(value) is list:
        # The usual key, a few ints and strs, written the way the encoder
        # would write them, without setting the encoder up for each call.
        parts = []
        for item in value:
            kind = type(item)
            if kind is int:
                parts.append(int.__repr__(item))
            elif kind is str:
                parts.append(_encode_str(item))
            else:
                return _ENCODER.encode(value)
        return "[" + ",".join(parts) + "]"
    return _ENCODER.encode(value)


#: (names in order, how many may be positional, defaults) of a simple signature.
_Simple = tuple[tuple[str, ...], int, dict[str, Any]]


def _simple_parameters(signature: Optional[inspect.Signature]) -> Optional[_Simple]:
    """The parameters of a signature without ``*args``, ``**kwargs`` or positional-only
    ones (the usual task), for :func:`_bind_simple`; None for any other."""
    if signature is None:
        return None
    kinds = [p.kind for p in signature.parameters.values()]
    ordinary = inspect.Parameter.POSITIONAL_OR_KEYWORD
    if any(k not in (ordinary, inspect.Parameter.KEYWORD_ONLY) for k in kinds):
        return None
    params = signature.parameters.values()
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    return tuple(signature.parameters), kinds.count(ordinary), defaults


def _bind_simple(
    simple: _Simple, args: Sequence[Any], kwargs: dict[str, Any]
) -> Optional[dict[str, Any]]:
    """``Signature.bind`` plus defaults, for a simple signature, at a fraction of
    its cost; None when the call does not fit (the slow path then says why)."""
    names, positional, defaults = simple
    if len(args) > positional:
        return None
    arguments = dict(zip(names, args))
    for name, value in kwargs.items():
        if name in arguments or name not in names:
            return None
        arguments[name] = value
    if len(arguments) < len(names):
        for name in names:
            if name not in arguments:
                if name not in defaults:
                    return None
                arguments[name] = defaults[name]
    return arguments


class KeySpec:
    """The ``lock_key`` of one task, checked against the task's signature."""

    def __init__(
        self, task_name: str, run: Callable[..., Any], lock_key: Any, *, bound: bool = False
    ) -> None:
        """``bound``: ``run`` is a plain function whose first parameter is the task
        (``bind=True``, or a class-based task's method), not a call argument."""
        self.task_name = task_name
        self.lock_key = lock_key
        try:
            signature: Optional[inspect.Signature] = inspect.signature(run)
        except (TypeError, ValueError):
            signature = None
        if signature is not None and bound:
            params = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=params)
        self.signature = signature
        self._simple = _simple_parameters(signature)
        self.params: tuple[str, ...] = ()
        self.template: Optional[str] = None
        self.func: Optional[Callable[..., Any]] = None
        if lock_key is None:
            return
        if isinstance(lock_key, str):
            self.template = lock_key
            self.params = tuple(
                field.split(".")[0].split("[")[0]
                for _, field, _, _ in string.Formatter().parse(lock_key)
                if field
            )
        elif isinstance(lock_key, (list, tuple)):
            if not lock_key or not all(isinstance(p, str) and p for p in lock_key):
                raise self._error("must list parameter names as non-empty strings")
            self.params = tuple(lock_key)
        elif callable(lock_key):
            self.func = lock_key
        else:
            raise self._error(
                "must be None, a list of parameter names, a str template or a callable"
            )
        self._check_params()

    def _error(self, what: str) -> ConfigurationError:
        return ConfigurationError(f"task {self.task_name!r}: lock_key={self.lock_key!r} {what}")

    def _check_params(self) -> None:
        if self.signature is None or not self.params:
            return
        parameters = self.signature.parameters
        if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            return  # **kwargs may carry anything; checked per call instead
        for name in self.params:
            if name.isdigit():
                raise self._error(f"uses positional field {{{name}}}; name the parameter")
            if name not in parameters:
                raise self._error(
                    f"names parameter {name!r}, but the task's parameters are "
                    f"({', '.join(parameters)})"
                )

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults applied."""
        if self.signature is None:
            return dict(kwargs)
        if self._simple is not None:
            arguments = _bind_simple(self._simple, args, kwargs)
            if arguments is not None:
                return arguments
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"task {self.task_name!r} called with bad arguments: {exc}") from exc
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for p in self.signature.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                arguments.update(arguments.pop(p.name, {}))
        return arguments

    def key(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        """The per-call part of the lock name ("" for one lock per task)."""
        if self.lock_key is None:
            return ""
        if self.func is not None:
            value = self.func(*args, **kwargs)
            return (
                value
                if isinstance(value, str)
                else self._canonical("the lock_key callable's result", value)
            )
        arguments = self.bind(args, kwargs)
        missing = [p for p in self.params if p not in arguments]
        if missing:
            raise self._error(f"names {missing!r}, not among this call's arguments")
        if self.template is not None:
            return self.template.format(**arguments)
        values = [arguments[p] for p in self.params]
        return self._canonical(f"argument(s) {', '.join(self.params)}", values)

    def _canonical(self, what: str, value: Any) -> str:
        try:
            return canonical(value)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"task {self.task_name!r}: cannot build a lock key from {what} = {value!r}: "
                f"{exc} (use values kombu's JSON can encode, or a lock_key callable)"
            ) from exc
