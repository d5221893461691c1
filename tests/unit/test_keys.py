"""Key building: every key of one lock in one Redis Cluster slot, for any name."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from celery_redislock import ConfigurationError, Lock
from celery_redislock.primitives import keys

# Any text, including braces, '#', control characters and long runs.
names = st.text(min_size=1, max_size=400) | st.text(alphabet="{}#:", min_size=1, max_size=20)


def hash_tag(key: str) -> str:
    """What Redis Cluster hashes: the text between the first '{' and the next '}', if any."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def all_keys(k: keys.LockKeys | keys.MultiKeys, token: str = "0123456789abcdef0123") -> list[str]:
    """Every key the primitive can touch, a waiter's wake list included."""
    return [key + token if field == "wake" else key for field, key in k._asdict().items()]


def slots(k: keys.LockKeys | keys.MultiKeys) -> set[int]:
    return {key_slot(key.encode("utf-8", "surrogatepass")) for key in all_keys(k)}


def test_lock_keys_layout() -> None:
    k = keys.lock_keys("redislock", "report")
    assert k == keys.LockKeys(
        lock="redislock:{report}:lock",
        fence="redislock:{report}:fence",
        queue="redislock:{report}:queue",
        meta="redislock:{report}:qmeta",
        pmsg="redislock:{report}:parked",
        inflight="redislock:{report}:inflight",
        wake="redislock:{report}:wake:",
    )
    assert k.script_keys == [k.lock, k.fence, k.queue, k.meta, k.pmsg, k.inflight]
    assert len(set(all_keys(k))) == len(k)
    assert len(slots(k)) == 1


@pytest.mark.parametrize("kind", ["sem", "rw"])
def test_multi_keys_share_the_lock_tag_without_colliding(kind: str) -> None:
    lock = keys.lock_keys("redislock", "report")
    multi = keys.multi_keys("redislock", "report", kind)
    assert multi.script_keys == [
        multi.holders,
        multi.fence,
        multi.queue,
        multi.meta,
        multi.pmsg,
        multi.inflight,
        multi.info,
    ]
    assert all(key.startswith(f"redislock:{{report}}:{kind}:") for key in all_keys(multi))
    assert slots(multi) == slots(lock)
    assert set(all_keys(multi)).isdisjoint(all_keys(lock))
    other = "rw" if kind == "sem" else "sem"
    assert set(all_keys(multi)).isdisjoint(all_keys(keys.multi_keys("redislock", "report", other)))


def test_digest_is_truncated_sha256() -> None:
    assert keys.digest("abc") == hashlib.sha256(b"abc").hexdigest()[:32]
    assert keys.digest(b"abc") == keys.digest("abc")
    assert keys.digest("abc", length=8) == hashlib.sha256(b"abc").hexdigest()[:8]
    # Lone surrogates are valid str characters and must not crash the digest.
    assert len(keys.digest("\ud800")) == 32


@pytest.mark.parametrize(
    ("name", "plain"),
    [
        ("report", True),
        ("with space:and:colons", True),
        ("ünïcødé ✓ 日本語", True),
        ("x" * keys.MAX_PLAIN_NAME, True),
        ("x" * (keys.MAX_PLAIN_NAME + 1), False),
        ("a{b", False),
        ("a}b", False),
        ("{b}", False),
        ("#not-a-digest", False),
        ("x" * 10_000, False),
    ],
)
def test_tag_spells_out_safe_names_and_digests_the_rest(name: str, plain: bool) -> None:
    tag = keys.tag("p", name)
    if plain:
        assert tag == f"p:{{{name}}}"
    else:
        assert tag == "p:{#" + keys.digest(name) + "}"
    assert len(slots(keys.lock_keys("p", name))) == 1


def test_ten_kilobyte_name_gives_short_keys() -> None:
    k = keys.lock_keys("redislock", "é" * 10_000)
    assert max(len(key) for key in all_keys(k)) < 100


@given(name=names)
def test_every_key_of_a_primitive_shares_one_hash_tag(name: str) -> None:
    for k in (
        keys.lock_keys("redislock", name),
        keys.multi_keys("redislock", name, "sem"),
        keys.multi_keys("redislock", name, "rw"),
    ):
        tags = {hash_tag(key) for key in all_keys(k)}
        assert len(tags) == 1
        (tag,) = tags
        # The tag is the whole name or its digest, never a fragment of the name.
        assert tag in (name, "#" + keys.digest(name))
        assert len(slots(k)) == 1


@given(a=names, b=names)
def test_different_names_never_share_keys(a: str, b: str) -> None:
    if a != b:
        assert keys.tag("redislock", a) != keys.tag("redislock", b)
        assert set(all_keys(keys.lock_keys("redislock", a))).isdisjoint(
            all_keys(keys.lock_keys("redislock", b))
        )


def test_a_name_spelling_out_a_digest_does_not_collide_with_it() -> None:
    long_name = "y" * 500
    assert keys.tag("p", long_name) != keys.tag("p", "#" + keys.digest(long_name))


@pytest.mark.parametrize("prefix", ["redislock", "app:locks", "ünï"])
def test_prefix_is_outside_the_hash_tag(prefix: str) -> None:
    k = keys.lock_keys(prefix, "n")
    assert all(key.startswith(prefix + ":{n}:") for key in all_keys(k))
    assert len(slots(k)) == 1


@pytest.mark.parametrize("prefix", ["{}", "app{}"])
def test_prefix_with_braces_is_rejected_or_keeps_keys_in_one_slot(prefix: str) -> None:
    try:
        lock = Lock(None, "n", prefix=prefix)
    except ConfigurationError:
        return
    assert len(slots(lock.keys)) == 1


def test_name_with_lone_surrogate_is_rejected_or_gets_encodable_keys() -> None:
    try:
        lock = Lock(None, "bad\ud800name")
    except ConfigurationError:
        return
    for key in all_keys(lock.keys):
        key.encode("utf-8")  # what redis-py's default encoder does
