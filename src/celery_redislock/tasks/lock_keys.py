"""Compile a task's ``lock_key`` option into a function of the call's arguments.

``lock_key`` may be None (one lock for the task), a list/tuple of parameter
names, a ``str.format`` template over the parameters, or a callable taking the
task's arguments.  Arguments are bound through the task's signature, so
positional, keyword and default values give the same key.

Every value that becomes part of a lock name goes through :func:`canonical`,
compact JSON with sorted dict keys, so equal arguments give one lock whatever
the order of a dict's keys, in the sender and in the worker alike:

- a parameter list ``["a", "b"]`` gives ``[<a>,<b>]``;
- each field of a template gives ``<value>`` (``"cust:{customer}"`` with
  ``"acme"`` gives ``cust:"acme"``, with ``42`` gives ``cust:42``), so
  ``"{a},{b}"`` is the list form without its brackets.  Fields may use
  attribute and index access (``{user.id}``, ``{order[id]}``); conversions
  (``!r``), format specs (``:>5``) and positional fields are refused;
- a callable's str result is used as it is, any other result is canonicalised.

Types are part of the key: ``1``, ``1.0``, ``"1"`` and ``True`` are four
different locks (``1``, ``1.0``, ``"1"``, ``true``), and so are equal numbers
written differently (``Decimal("1.0")`` and ``Decimal("1.00")``).  What the
JSON message does not keep is not part of the key either: a tuple is a list,
and a dict key is its JSON string (``{1: x}`` is ``{"1": x}``).  UUID, Decimal
and date/time values are their plain strings (so ``UUID(...)`` and its str
share a lock); other types go through kombu's JSON encoder (``__json__``,
registered types, bytes).  A value without one stable form is refused with
:class:`ConfigurationError` rather than given a lock of its own per call:
objects kombu cannot encode, hook output holding a memory address, NaN
(it is not equal to itself), sets (no order) and self-containing values.
"""

from __future__ import annotations

import datetime
import decimal
import inspect
import json
import re
import string
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Optional

from kombu.utils.json import JSONEncoder

from ..exceptions import ConfigurationError

__all__ = ["KeySpec", "canonical"]


#: Writes the plain data :func:`_plain_tree` makes (so it needs no ``default``).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)

#: How the encoder above writes a str (with ensure_ascii=False).
_encode_str = json.encoder.encode_basestring

#: kombu's hooks for other types (``__json__``, ``register_type``, bytes).
_KOMBU = JSONEncoder()

#: A default repr (``<Foo object at 0x7f...>``): different in every process.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")

_FORMATTER = string.Formatter()


def canonical(value: Any) -> str:
    """Deterministic compact JSON of ``value``: one string for equal values of
    the same types, in any process, and for the copy the worker decodes from
    the message.

    Raises TypeError for a type without a stable JSON form and ValueError for a
    value without one (NaN, a self-containing value, colliding dict keys).
    """
    kind = type(value)
    if kind is str:
        return _encode_str(value)
    if kind is int:
        return int.__repr__(value)
    if kind is list:
        # The usual key, a few ints and strs, written the way the encoder
        # would write them, without walking the value or setting up the encoder.
        parts = []
        for item in value:
            kind = type(item)
            if kind is int:
                parts.append(int.__repr__(item))
            elif kind is str:
                parts.append(_encode_str(item))
            else:
                return _ENCODER.encode(_plain_tree(value, False, set()))
        return "[" + ",".join(parts) + "]"
    return _ENCODER.encode(_plain_tree(value, False, set()))


def _plain_tree(value: Any, hooked: bool, active: set[int]) -> Any:
    """``value`` as plain JSON data: dicts with str keys, lists, str, int,
    float, bool and None.  ``hooked``: produced by a kombu hook, whose strings
    are checked for memory addresses; ``active``: ids of the enclosing values."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        if hooked and _ADDRESS.search(value):
            raise ValueError(
                f"its JSON form {value!r} holds a memory address, which differs per process"
            )
        return value
    if isinstance(value, float):
        if value != value:
            raise ValueError("NaN is not equal to itself, so it cannot name a lock")
        return value
    if isinstance(value, (dict, list, tuple)):
        return _plain_container(value, hooked, active)
    if isinstance(value, (set, frozenset)):
        raise TypeError(f"a {type(value).__name__} has no order; pass a sorted list")
    return _plain_other(value, active)


def _plain_container(value: Any, hooked: bool, active: set[int]) -> Any:
    """A dict (keys as JSON writes them, so the worker's decoded copy agrees)
    or a list/tuple (a list, as the message makes it)."""
    ident = id(value)
    if ident in active:
        raise ValueError("it contains itself")
    active.add(ident)
    try:
        if not isinstance(value, dict):
            return [_plain_tree(item, hooked, active) for item in value]
        plain: dict[str, Any] = {}
        for key, item in value.items():
            name = _plain_dict_key(key)
            if name in plain:
                raise ValueError(f"two of its dict keys are both written {name!r}")
            plain[name] = _plain_tree(item, hooked, active)
        return plain
    finally:
        active.discard(ident)


def _plain_dict_key(key: Any) -> str:
    """A dict key as JSON writes it: ``1`` as ``"1"``, ``True`` as ``"true"``."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        if key != key:
            raise ValueError("a NaN dict key is not equal to itself")
        return _ENCODER.encode(key)
    raise TypeError(f"dict keys must be str, int, float, bool or None, not {type(key).__name__}")


def _plain_other(value: Any, active: set[int]) -> Any:
    """UUID, Decimal and date/time values as plain strings, so lock names stay
    readable and do not depend on kombu's tagged encoding (which could change
    between versions during a rolling upgrade); anything else through kombu."""
    if isinstance(value, decimal.Decimal):
        if value.is_nan():
            raise ValueError("NaN is not equal to itself, so it cannot name a lock")
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    ident = id(value)
    if ident in active:
        raise ValueError("its JSON form contains itself")
    active.add(ident)
    try:
        # TypeError ("not JSON serializable") for objects without a hook.
        return _plain_tree(_KOMBU.default(value), True, active)
    finally:
        active.discard(ident)


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


#: One piece of a compiled template: literal text, then a field and the
#: parameter it starts with (both None after the last field).
_Piece = tuple[str, Optional[str], Optional[str]]


class KeySpec:
    """The ``lock_key`` of one task, checked against the task's signature."""

    def __init__(
        self,
        task_name: str,
        run: Callable[..., Any],
        lock_key: Any,
        *,
        bound: bool = False,
        option: str = "lock_key",
    ) -> None:
        """``bound``: ``run`` is a plain function whose first parameter is the task
        (``bind=True``, or a class-based task's method), not a call argument.
        ``option``: the option the key comes from, as errors name it
        (``lock_key`` or ``unique_key``)."""
        self.task_name = task_name
        self.lock_key = lock_key
        self.option = option
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
        self._pieces: tuple[_Piece, ...] = ()
        self.func: Optional[Callable[..., Any]] = None
        if lock_key is None:
            return
        if isinstance(lock_key, str):
            self.template = lock_key
            self._pieces = self._compile_template(lock_key)
            self.params = tuple(dict.fromkeys(name for _, _, name in self._pieces if name))
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
        return ConfigurationError(
            f"task {self.task_name!r}: {self.option}={self.lock_key!r} {what}"
        )

    def _compile_template(self, template: str) -> tuple[_Piece, ...]:
        """The template's literal text and fields; a field may only name a
        parameter, with attribute and index access, since its value is always
        written as :func:`canonical` JSON."""
        try:
            parsed = list(_FORMATTER.parse(template))
        except ValueError as exc:
            raise self._error(f"is not a valid template: {exc}") from None
        pieces: list[_Piece] = []
        for literal, field, spec, conversion in parsed:
            if field is None:
                pieces.append((literal, None, None))
                continue
            shown = "{" + field + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            name = field.split(".")[0].split("[")[0]
            if not name or name.isdigit():
                raise self._error(f"uses positional field {shown}; name the parameter")
            if conversion or spec:
                raise self._error(
                    f"field {shown} has a {'conversion' if conversion else 'format spec'}; "
                    f"fields are always written as canonical JSON, so use {{{field}}} alone"
                )
            pieces.append((literal, field, name))
        return tuple(pieces)

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
                else self._canonical(f"the {self.option} callable's result", value)
            )
        arguments = self.bind(args, kwargs)
        missing = [p for p in self.params if p not in arguments]
        if missing:
            raise self._error(f"names {missing!r}, not among this call's arguments")
        if self.template is not None:
            return self._render(arguments)
        values = [arguments[p] for p in self.params]
        try:
            return canonical(values)
        except (TypeError, ValueError):
            for name in self.params:  # name the argument at fault
                self._canonical(f"argument {name}", arguments[name])
            return self._canonical(f"argument(s) {', '.join(self.params)}", values)

    def _render(self, arguments: dict[str, Any]) -> str:
        """The template with each field's value written as canonical JSON."""
        parts = []
        for literal, field, name in self._pieces:
            parts.append(literal)
            if field is None or name is None:
                continue
            if field == name:
                value = arguments[name]
            else:
                try:
                    value = _FORMATTER.get_field(field, (), arguments)[0]
                except (AttributeError, LookupError, TypeError) as exc:
                    raise self._error(
                        f"field {{{field}}} cannot be read from argument {name} = "
                        f"{_shown(arguments[name])}: {exc!r}"
                    ) from exc
            what = f"argument {name}" + ("" if field == name else f" (field {{{field}}})")
            parts.append(self._canonical(what, value))
        return "".join(parts)

    def _canonical(self, what: str, value: Any) -> str:
        try:
            return canonical(value)
        except (TypeError, ValueError) as exc:
            kind = "lock" if self.option == "lock_key" else "unique"
            raise ConfigurationError(
                f"task {self.task_name!r}: cannot build a {kind} key from {what} = "
                f"{_shown(value)}: {exc} (use values with one JSON form: JSON types, UUID, "
                f"Decimal, dates, or types with a kombu JSON hook; or a {self.option} callable)"
            ) from exc


def _shown(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut short for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
