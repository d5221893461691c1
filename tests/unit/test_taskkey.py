"""lock_key compilation: argument binding and canonical values (no Redis, no worker)."""

from __future__ import annotations

import inspect
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from kombu.utils.json import dumps, loads

from celery_redislock import ConfigurationError, LockedTask
from celery_redislock.tasks.lock_keys import KeySpec, canonical


def charge(user_id: int, amount: Decimal, currency: str = "EUR", *, note: str = "") -> None:
    """A task body's signature, as a plain function (bind=False)."""


def spec(lock_key: Any, run: Any = charge, name: str = "billing.charge") -> KeySpec:
    return KeySpec(name, run, lock_key)


# -- binding ---------------------------------------------------------------------


def test_no_lock_key_means_one_lock_per_task() -> None:
    assert spec(None).key((1, Decimal("2")), {}) == ""


def test_positional_keyword_and_default_values_give_one_key() -> None:
    s = spec(["user_id", "currency"])
    expected = s.key((7, Decimal("1.00")), {})
    assert expected == '[7,"EUR"]'
    assert s.key((), {"user_id": 7, "amount": Decimal("1.00")}) == expected
    assert s.key((7,), {"amount": Decimal("9"), "currency": "EUR"}) == expected
    assert s.key((7, Decimal("1"), "EUR"), {"note": "x"}) == expected
    assert s.key((7, Decimal("1"), "USD"), {}) != expected


def test_parameter_order_follows_lock_key_not_the_call() -> None:
    s = spec(("currency", "user_id"))
    assert s.key((), {"currency": "USD", "user_id": 3, "amount": 1}) == '["USD",3]'


def test_keyword_only_and_var_keyword_parameters() -> None:
    def body(a: int, **extra: Any) -> None:
        """Accepts anything by keyword."""

    assert spec(["note"]).key((1, 2), {"note": "n"}) == '["n"]'
    s = spec(["region"], run=body)  # not checked at definition: **extra may carry it
    assert s.key((1,), {"region": "eu"}) == '["eu"]'
    with pytest.raises(ConfigurationError, match=r"'region'.*not among this call's arguments"):
        s.key((1,), {})


def test_bad_call_arguments_name_the_task() -> None:
    with pytest.raises(TypeError, match=r"task 'billing.charge' called with bad arguments"):
        spec(["user_id"]).key((), {"amount": 1})


def test_template() -> None:
    s = spec("user:{user_id}:{currency}")
    assert s.params == ("user_id", "currency")
    assert s.key((5, 1), {}) == 'user:5:"EUR"'
    assert s.key((), {"user_id": 5, "amount": 1, "currency": "EUR"}) == 'user:5:"EUR"'
    # Attribute and index access use the parameter named before the dot/bracket.
    assert spec("{user_id.real}").params == ("user_id",)
    assert spec("{{literal}}:{user_id}").key((5, 1), {}) == "{literal}:5"


def test_template_fields_are_canonical_json() -> None:
    s = spec("cust:{user_id}")
    assert s.key(("acme", 1), {}) == 'cust:"acme"'
    assert s.key((42, 1), {}) == "cust:42"
    assert s.key(({"b": [1, 2], "a": "x"}, 1), {}) == 'cust:{"a":"x","b":[1,2]}'
    assert s.key(({"a": "x", "b": [1, 2]}, 1), {}) == 'cust:{"a":"x","b":[1,2]}'
    assert s.key((uuid.UUID(int=1), 1), {}) == f'cust:"{uuid.UUID(int=1)}"'
    assert s.key((None, 1), {}) == "cust:null"


def test_template_attribute_and_index_fields_are_canonicalised() -> None:
    class User:
        def __init__(self, ident: Any) -> None:
            self.id = ident

    assert spec("u:{user_id.id}").key((User("7"), 1), {}) == 'u:"7"'
    assert spec("u:{user_id.id}").key((User(7), 1), {}) == "u:7"
    assert spec("o:{user_id[id]}").key(({"id": "x"}, 1), {}) == 'o:"x"'
    assert spec("o:{user_id[0]}/{user_id[1]}").key(([3, "y"], 1), {}) == 'o:3/"y"'
    # Only the resolved value needs a stable form, not the object it was read from.
    assert spec("u:{user_id.id}").key((User({"b": 1, "a": 2}), 1), {}) == 'u:{"a":2,"b":1}'
    with pytest.raises(ConfigurationError) as info:
        spec("o:{user_id[id]}").key(({"other": 1}, 1), {})
    assert "task 'billing.charge'" in str(info.value)
    assert "{user_id[id]}" in str(info.value) and "KeyError" in str(info.value)


def test_template_field_without_a_stable_form_is_refused() -> None:
    """Old behaviour: str() of the value, so object() locked on its address (a new
    lock per call) and NaN, sets and the like locked silently."""

    class Opaque:
        pass

    for value in (object(), Opaque(), float("nan"), {"b", "a"}):
        with pytest.raises(ConfigurationError) as info:
            spec("cust:{user_id}").key((value, 1), {})
        message = str(info.value)
        assert "task 'billing.charge'" in message
        assert "argument user_id" in message
        assert repr(value) in message
    holder = type("Holder", (), {"id": object()})()
    with pytest.raises(ConfigurationError, match=r"argument user_id \(field \{user_id\.id\}\)"):
        spec("{user_id.id}").key((holder, 1), {})


def test_callable_gets_the_call_as_made() -> None:
    seen = []

    def key(*args: Any, **kwargs: Any) -> Any:
        seen.append((args, kwargs))
        return {"b": 2, "a": [uuid.UUID(int=1)]}

    s = spec(key)
    value = s.key((1,), {"amount": 2})
    assert seen == [((1,), {"amount": 2})]
    assert value == canonical({"a": [uuid.UUID(int=1)], "b": 2})
    assert value.startswith('{"a":')
    assert spec(lambda user_id, *a, **k: f"u{user_id}").key((9, 1), {}) == "u9"


def test_class_based_task_run_without_self() -> None:
    class Plain(LockedTask):
        name = "tests.plain"
        lock_key = ["x"]

        @staticmethod
        def run(x: int, y: int = 0) -> None:
            """bind=False style: run is a staticmethod."""

    assert Plain._redislock_keyspec is not None
    assert Plain._redislock_keyspec.key((1,), {}) == "[1]"


def test_bound_run_binds_arguments_after_self() -> None:
    class Bound(LockedTask):
        name = "tests.bound"
        lock_key = ["x"]

        def run(self, x: int, y: int = 0) -> None:
            """bind=True style: run is a method."""

    assert Bound._redislock_keyspec is not None
    assert Bound._redislock_keyspec.key((1,), {}) == "[1]"
    assert Bound._redislock_keyspec.key((), {"x": 1}) == "[1]"


# -- definition errors -------------------------------------------------------------


@pytest.mark.parametrize(
    ("lock_key", "words"),
    [
        (["user"], ["names parameter 'user'", "user_id, amount, currency, note"]),
        ("acct:{account}", ["'account'"]),
        ("acct:{0}", ["positional field {0}"]),
        ("acct:{}", ["positional field {}"]),
        ("acct:{[0]}", ["positional field {[0]}"]),
        ("acct:{user_id!r}", ["'acct:{user_id!r}'", "{user_id!r} has a conversion"]),
        ("acct:{user_id!s}", ["{user_id!s} has a conversion"]),
        ("acct:{user_id:>5}", ["'acct:{user_id:>5}'", "{user_id:>5} has a format spec"]),
        ("acct:{user_id.real:x}", ["{user_id.real:x} has a format spec"]),
        ("acct:{user_id", ["not a valid template"]),
        ([], ["non-empty strings"]),
        (["user_id", ""], ["non-empty strings"]),
        (["user_id", 3], ["non-empty strings"]),
        (3.5, ["must be None, a list of parameter names, a str template or a callable"]),
    ],
)
def test_bad_lock_key_names_task_and_problem(lock_key: Any, words: list[str]) -> None:
    with pytest.raises(ConfigurationError) as info:
        spec(lock_key)
    message = str(info.value)
    assert message.startswith("task 'billing.charge': lock_key=")
    for word in words:
        assert word in message, (word, message)


# -- canonical values --------------------------------------------------------------


def test_compact_and_sorted() -> None:
    assert canonical({"b": [1, 2], "a": "x y"}) == '{"a":"x y","b":[1,2]}'
    assert canonical("é") == '"é"'


def test_the_short_way_for_ints_and_strs_writes_what_the_encoder_writes() -> None:
    import json

    from celery_redislock.tasks import lock_keys as taskkey

    samples: list[list[Any]] = [
        [],
        [0, -1, 2**70, -(2**70)],
        ["", "x y", 'q"uo\\te', "ctl\x00\x1f\n\t", "é", "\u2028", "\ud800", "😀"],
        [42, "user:{42}", 7],
        [True, 1],  # bool is not int here: the encoder writes true
        [1.5, "x"],
        [None],
        [[1], "x"],
    ]
    for value in samples:
        assert canonical(value) == taskkey._ENCODER.encode(value), value
        assert json.loads(canonical(value)) == value
    assert canonical([True, 1]) == "[true,1]"


def test_uuid_datetime_decimal_values_survive_the_message_round_trip() -> None:
    """The worker computes the key from the decoded message: it must match the sender's."""
    s = spec(["user_id", "amount", "currency"])
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    when = datetime(2024, 5, 17, 12, 30, 1, 250000, tzinfo=timezone.utc)
    args = (ident, Decimal("12.50"), when)
    key = s.key(args, {})
    decoded = loads(dumps(list(args)))
    assert [type(v) for v in decoded] == [uuid.UUID, Decimal, datetime]
    assert s.key(decoded, {}) == key
    assert s.key((uuid.UUID(str(ident)), Decimal("12.50"), when), {}) == key
    assert s.key((uuid.UUID(int=1), Decimal("12.50"), when), {}) != key
    assert s.key((ident, Decimal("12.51"), when), {}) != key
    assert s.key((ident, Decimal("12.50"), when.replace(microsecond=0)), {}) != key
    assert canonical(date(2024, 1, 2)) == canonical(date(2024, 1, 2))
    assert canonical(date(2024, 1, 2)) != canonical(date(2024, 1, 3))


def test_unencodable_argument_names_task_argument_and_value() -> None:
    opaque = object()
    with pytest.raises(ConfigurationError) as info:
        spec(["currency", "user_id"]).key((opaque, 1), {})
    message = str(info.value)
    assert "task 'billing.charge'" in message
    assert "argument user_id =" in message
    assert repr(opaque) in message
    assert isinstance(info.value.__cause__, TypeError)


def test_unencodable_callable_result() -> None:
    with pytest.raises(ConfigurationError, match="the lock_key callable's result"):
        spec(lambda *a, **k: {1, 2}).key((1, 2), {})


class _Plain:
    """A user class without a JSON hook."""


class _ReprHook:
    """A JSON hook that writes the default repr (with the object's address)."""

    def __json__(self) -> str:
        return repr(self)


class _NestedReprHook:
    def __json__(self) -> dict[str, Any]:
        return {"obj": object.__repr__(self)}


class _SelfHook:
    def __json__(self) -> Any:
        return self


class _DictHook:
    def __init__(self, ident: int) -> None:
        self.ident = ident

    def __json__(self) -> dict[str, Any]:
        return {"kind": "dict-hook", "id": self.ident}


def _circular() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


UNSTABLE = [
    pytest.param(object(), "not JSON serializable", id="object"),
    pytest.param(_Plain(), "not JSON serializable", id="user-class"),
    pytest.param(_ReprHook(), "memory address", id="hook-repr"),
    pytest.param(_NestedReprHook(), "memory address", id="hook-nested-repr"),
    pytest.param(_SelfHook(), "contains itself", id="hook-self"),
    pytest.param(float("nan"), "NaN", id="nan"),
    pytest.param([1.5, float("nan")], "NaN", id="nan-in-list"),
    pytest.param({"a": float("nan")}, "NaN", id="nan-in-dict"),
    pytest.param({float("nan"): 1}, "NaN", id="nan-dict-key"),
    pytest.param(Decimal("NaN"), "NaN", id="decimal-nan"),
    pytest.param(Decimal("sNaN"), "NaN", id="decimal-snan"),
    pytest.param({"b", "a"}, "set has no order", id="set"),
    pytest.param(frozenset({1, 2}), "frozenset has no order", id="frozenset"),
    pytest.param([{"x", "y"}], "set has no order", id="set-in-list"),
    pytest.param({1: "a", "1": "b"}, "both written '1'", id="colliding-dict-keys"),
    pytest.param({(1, 2): "a"}, "dict keys must be", id="tuple-dict-key"),
    pytest.param(_circular(), "contains itself", id="circular"),
]


@pytest.mark.parametrize(("value", "reason"), UNSTABLE)
def test_values_without_one_stable_form_are_refused(value: Any, reason: str) -> None:
    """In every form (list, template, callable result), naming task, argument and value."""
    forms = [
        (spec(["currency", "user_id"]), "argument user_id ="),
        (spec("u:{user_id}"), "argument user_id ="),
        (spec(lambda *a, **k: [a[0]]), "the lock_key callable's result ="),
    ]
    for s, what in forms:
        with pytest.raises(ConfigurationError) as info:
            s.key((value, 1), {})
        message = str(info.value)
        assert message.startswith("task 'billing.charge': cannot build a lock key from "), message
        assert what in message and reason in message, message
        assert repr(value)[:40] in message
        assert isinstance(info.value.__cause__, (TypeError, ValueError))
    with pytest.raises((TypeError, ValueError), match=reason):
        canonical(value)


def test_kombu_hooks_and_bytes_give_stable_keys() -> None:
    assert canonical(_DictHook(3)) == '{"id":3,"kind":"dict-hook"}'
    assert spec("h:{user_id}").key((_DictHook(3), 1), {}) == 'h:{"id":3,"kind":"dict-hook"}'
    assert canonical(b"ab") == '{"__type__":"bytes","__value__":"ab"}'
    assert canonical(b"\xff") == '{"__type__":"base64","__value__":"/w=="}'
    assert canonical(float("inf")) == "Infinity"  # equal to itself: allowed


def test_types_are_part_of_the_key() -> None:
    """1, 1.0, "1" and True are four locks; a tuple is a list (the message makes it one)."""
    for s in (spec(["user_id"]), spec("{user_id}")):
        keys = [s.key((v, 1), {}) for v in (1, 1.0, "1", True)]
        assert len(set(keys)) == 4, keys
        assert s.key(((1, "a"), 1), {}) == s.key(([1, "a"], 1), {})
    assert [canonical(v) for v in (1, 1.0, "1", True)] == ["1", "1.0", '"1"', "true"]
    # UUID, Decimal and dates are their plain strings, so they share their str's lock.
    assert canonical(Decimal("1")) == canonical("1")
    assert canonical(Decimal("1.0")) != canonical(Decimal("1.00"))


def test_non_str_dict_keys_are_written_as_json_writes_them() -> None:
    """The worker decodes {9: x, 10: y} as {"9": x, "10": y}: both must give one key
    (the old encoder sorted int keys as numbers, 9 before 10, and strs as text)."""
    value = {9: "a", 10: "b", True: "t", None: "n"}
    assert canonical(value) == '{"10":"b","9":"a","null":"n","true":"t"}'
    assert canonical(loads(dumps(value))) == canonical(value)
    assert canonical({1: "x", "b": 2}) == '{"1":"x","b":2}'  # mixed key types sort as text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_canonical_ignores_dict_order(d: dict[str, Any]) -> None:
    reordered = dict(reversed(list(d.items())))
    assert canonical(d) == canonical(reordered)


@given(json_values, json_values)
def test_canonical_is_injective_on_json_values(a: Any, b: Any) -> None:
    if canonical(a) == canonical(b):
        assert a == b


def _shuffled(draw: Any, value: Any) -> Any:
    """An equal value whose dicts (at every depth) list their keys in another order."""
    if isinstance(value, dict):
        keys = draw(st.permutations(list(value)))
        return {k: _shuffled(draw, value[k]) for k in keys}
    if isinstance(value, list):
        return [_shuffled(draw, item) for item in value]
    return value


@st.composite
def dict_and_shuffled(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    value = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
    return value, _shuffled(draw, value)


@given(dict_and_shuffled())
def test_equal_dicts_in_any_key_order_give_one_key_in_every_form(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    d, shuffled = pair
    assert d == shuffled
    for s in (spec(["user_id"]), spec("c:{user_id}"), spec(lambda *a, **k: a[0])):
        assert s.key((d, 1), {}) == s.key((shuffled, 1), {})


def _two_params(a: Any, b: Any = None) -> None:
    """Two parameters, for comparing a template with the list form."""


@given(json_values, json_values)
def test_template_is_the_list_form_without_brackets(a: Any, b: Any) -> None:
    """lock_key="{a},{b}" renders what lock_key=["a", "b"] renders, minus "[" and "]"."""
    as_list = KeySpec("t", _two_params, ["a", "b"]).key((a, b), {})
    assert "[" + KeySpec("t", _two_params, "{a},{b}").key((a, b), {}) + "]" == as_list
    assert "[" + KeySpec("t", _two_params, "{a}").key((a, b), {}) + "]" == canonical([a])


wire_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.uuids(version=4)  # kombu 5.3.0 cannot decode UUIDs of versions 6-8
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.datetimes()
    | st.dates()
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(
            st.text(max_size=5) | st.integers() | st.booleans() | st.none(), children, max_size=4
        )
    ),
    max_leaves=12,
)


@given(wire_values)
def test_the_worker_decoding_the_message_computes_the_same_key(value: Any) -> None:
    """What the sender canonicalises equals what the worker gets from kombu's JSON."""
    try:
        expected = canonical(value)
    except ValueError:  # colliding dict keys, such as 1 and "1"
        assume(False)
    assert canonical(loads(dumps(value))) == expected


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1,), {}),
        ((1, 2), {}),
        ((1,), {"b": 2}),
        ((), {"a": 1, "b": 2, "c": 3}),
        ((1, 2), {"c": 4}),
    ],
)
def test_fast_binding_agrees_with_signature_bind(args: Any, kwargs: Any) -> None:
    def body(a: int, b: int = 5, *, c: int = 6) -> None:
        """A simple signature: the fast path binds it."""

    s = KeySpec("t", body, ["a", "b", "c"])
    assert s._simple is not None
    expected = inspect.signature(body).bind(*args, **kwargs)
    expected.apply_defaults()
    assert s.bind(args, kwargs) == dict(expected.arguments)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1, 2, 3), {}), ((1,), {"a": 1}), ((), {"b": 1}), ((1,), {"zz": 1})],
)
def test_calls_the_fast_binding_refuses_still_fail_clearly(args: Any, kwargs: Any) -> None:
    def body(a: int, b: int = 5, *, c: int = 6) -> None:
        """Too many, doubled, missing or unknown arguments."""

    with pytest.raises(TypeError, match=r"task 't' called with bad arguments"):
        KeySpec("t", body, ["a"]).key(args, kwargs)
