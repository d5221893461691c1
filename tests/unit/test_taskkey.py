"""lock_key compilation: argument binding and canonical values (no Redis, no worker)."""

from __future__ import annotations

import inspect
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kombu.utils.json import dumps, loads

from celery_redislock import ConfigurationError, LockedTask
from celery_redislock.taskkey import KeySpec, canonical


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
    assert s.key((5, 1), {}) == "user:5:EUR"
    assert s.key((), {"user_id": 5, "amount": 1, "currency": "EUR"}) == "user:5:EUR"
    # Attribute and index access use the parameter named before the dot/bracket.
    assert spec("{user_id.real}").params == ("user_id",)


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

    from celery_redislock import taskkey

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
        spec(["user_id", "currency"]).key((opaque, 1), {})
    message = str(info.value)
    assert "task 'billing.charge'" in message
    assert "user_id, currency" in message
    assert repr(opaque) in message
    assert isinstance(info.value.__cause__, TypeError)


def test_unencodable_callable_result() -> None:
    with pytest.raises(ConfigurationError, match="the lock_key callable's result"):
        spec(lambda *a, **k: {1, 2}).key((1, 2), {})


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
