"""Mapping messages to partitions: FNV-1a, modulo, rendezvous and random mappings."""

from __future__ import annotations

import collections
import hashlib
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.errors import GazetteError
from gazette.labels import LabelSet, Selector, parse_selector
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML, TUTORIAL_SELECTIONS
from gazette.message.mapping import (
    NoPartitions,
    Partition,
    StaticPartitions,
    fnv1a_32,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)
from gazette.protocol import JournalSpec
from gazette.protocol.trees import journal_changes_from_yaml

NDJSON = "application/x-ndjson"


def tutorial_specs() -> list[JournalSpec]:
    return [c.spec for c in journal_changes_from_yaml(TUTORIAL_JOURNALS_YAML) if c.spec]


FOOBAR = StaticPartitions(tutorial_specs(), parse_selector("prefix=foobar/"))


class ListPartitions:
    """A `Partitions` whose list the test replaces (a new tuple on each change)."""

    def __init__(self, names: Sequence[str], selector: str = "prefix=test/") -> None:
        self.selector = parse_selector(selector)
        self.set(names)

    def set(self, names: Sequence[str]) -> None:
        self._parts = tuple(Partition(n, "test/lines") for n in sorted(names))

    def current(self) -> tuple[Partition, ...]:
        return self._parts


def identity(msg: bytes) -> bytes:
    return msg


def keys(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(1, 24)) for _ in range(n)]


# --- FNV-1a ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expect"),
    [
        (b"", 0x811C9DC5),
        (b"a", 0xE40C292C),
        (b"b", 0xE70C2DE5),
        (b"foobar", 0xBF9CF968),
        (b"\x00", 0x050C5D1F),
    ],
)
def test_fnv1a_32_vectors(data: bytes, expect: int) -> None:
    assert fnv1a_32(data) == expect


@given(st.binary(max_size=64))
def test_fnv1a_32_is_32_bits_and_byte_at_a_time(data: bytes) -> None:
    h = fnv1a_32(data)
    assert 0 <= h < 1 << 32
    # FNV-1a is incremental: hashing a suffix continues from the prefix's state.
    if data:
        prefix = fnv1a_32(data[:-1])
        assert h == ((prefix ^ data[-1]) * 16777619) % (1 << 32)


# --- partitions --------------------------------------------------------------------------


def test_static_partitions_of_the_tutorial_journals() -> None:
    parts = FOOBAR.current()
    assert parts == (
        Partition("foobar/part-000", NDJSON),
        Partition("foobar/part-001", NDJSON),
        Partition("foobar/part-002", NDJSON),
    )
    assert FOOBAR.current() is parts  # unchanged: the same object
    assert FOOBAR.selector == parse_selector("prefix=foobar/")
    assert "prefix=foobar/" in repr(FOOBAR)


@pytest.mark.parametrize(("selector", "names"), TUTORIAL_SELECTIONS)
def test_static_partitions_match_the_tutorial_selections(
        selector: str, names: tuple[str, ...]) -> None:
    specs = tutorial_specs()
    parts = StaticPartitions(reversed(specs), parse_selector(selector)).current()
    assert tuple(p.journal for p in parts) == tuple(sorted(names))


def test_static_partitions_sort_by_name_and_default_content_type() -> None:
    specs = [
        JournalSpec("b/two", labels=LabelSet({"content-type": "text/csv"})),
        JournalSpec("a/one"),
        JournalSpec("c/three", labels=LabelSet({"content-type": NDJSON})),
    ]
    parts = StaticPartitions(specs, Selector()).current()
    assert parts == (
        Partition("a/one", ""),
        Partition("b/two", "text/csv"),
        Partition("c/three", NDJSON),
    )
    assert StaticPartitions(specs, parse_selector("prefix=x/")).current() == ()


# --- modulo ------------------------------------------------------------------------------


def test_modulo_mapping_is_fnv_modulo_count() -> None:
    mapping = modulo_mapping(identity, FOOBAR)
    for key in [b"", b"a", b"foobar", *keys(200)]:
        assert mapping(key) == FOOBAR.current()[fnv1a_32(key) % 3]
    assert mapping(b"foobar").journal == "foobar/part-001"  # 0xbf9cf968 % 3 == 1


def test_modulo_mapping_is_stable_and_balanced() -> None:
    mapping = modulo_mapping(identity, FOOBAR)
    again = modulo_mapping(identity, StaticPartitions(tutorial_specs(), FOOBAR.selector))
    ks = keys(6000)
    counts = collections.Counter(mapping(k).journal for k in ks)
    assert all(mapping(k) == again(k) for k in ks)
    assert set(counts) == {p.journal for p in FOOBAR.current()}
    assert all(1700 < n < 2300 for n in counts.values()), counts


def test_modulo_mapping_keys_of_messages() -> None:
    mapping = modulo_mapping(lambda m: m["user"].encode(), FOOBAR)
    first = mapping({"user": "alice", "n": 1})
    assert mapping({"user": "alice", "n": 2}) == first
    with pytest.raises(KeyError):
        mapping({"nobody": 1})


def test_modulo_mapping_follows_partition_changes() -> None:
    parts = ListPartitions(["test/a"])
    mapping = modulo_mapping(identity, parts)
    assert mapping(b"x").journal == "test/a"
    parts.set(["test/a", "test/b"])
    assert {mapping(k).journal for k in keys(50)} == {"test/a", "test/b"}


# --- rendezvous --------------------------------------------------------------------------


def reference_hrw(key: bytes, names: Sequence[str]) -> str:
    """The documented weight, computed independently of the module."""
    return max(sorted(names), key=lambda n: hashlib.blake2b(
        n.encode() + b"\0" + key, digest_size=8).digest())


def test_rendezvous_mapping_is_documented_weight() -> None:
    mapping = rendezvous_mapping(identity, FOOBAR)
    names = [p.journal for p in FOOBAR.current()]
    for key in [b"", b"alice", *keys(300)]:
        assert mapping(key).journal == reference_hrw(key, names)
    # Pinned: a change of hash would move every key of every deployed topic.
    assert [mapping(k).journal[-3:] for k in (b"alice", b"bob", b"dave", b"foobar")] == [
        "002", "000", "000", "002"]


def test_rendezvous_mapping_is_balanced() -> None:
    names = [f"test/part-{i:03d}" for i in range(8)]
    mapping = rendezvous_mapping(identity, ListPartitions(names))
    counts = collections.Counter(mapping(k).journal for k in keys(8000))
    assert set(counts) == set(names)
    assert all(800 < n < 1200 for n in counts.values()), counts


def test_rendezvous_adding_a_partition_moves_about_one_nth() -> None:
    names = [f"test/part-{i:03d}" for i in range(10)]
    parts = ListPartitions(names)
    mapping = rendezvous_mapping(identity, parts)
    ks = keys(11000)
    before = [mapping(k).journal for k in ks]
    parts.set([*names, "test/part-010"])
    after = [mapping(k).journal for k in ks]
    moved = [a for b, a in zip(before, after, strict=True) if a != b]
    assert set(moved) == {"test/part-010"}
    assert 800 < len(moved) < 1200  # ~1/11 of 11000


@settings(max_examples=150, deadline=None)
@given(
    names=st.lists(
        st.from_regex(r"test/[a-z0-9]{1,8}", fullmatch=True), min_size=1, max_size=12,
        unique=True),
    extra=st.from_regex(r"test/[a-z0-9]{1,8}", fullmatch=True),
    ks=st.lists(st.binary(max_size=16), min_size=1, max_size=60),
    data=st.data(),
)
def test_rendezvous_minimal_movement(
        names: list[str], extra: str, ks: list[bytes], data: st.DataObject) -> None:
    parts = ListPartitions(names)
    mapping = rendezvous_mapping(identity, parts)
    before = [mapping(k).journal for k in ks]

    if extra not in names:  # adding: keys move only onto the new partition
        parts.set([*names, extra])
        after = [mapping(k).journal for k in ks]
        for b, a in zip(before, after, strict=True):
            assert a in (b, extra)

    if len(names) > 1:  # removing: only the removed partition's keys move
        gone = data.draw(st.sampled_from(names))
        parts.set([n for n in names if n != gone])
        after = [mapping(k).journal for k in ks]
        for b, a in zip(before, after, strict=True):
            assert a == b if b != gone else a != gone


def test_rendezvous_precomputes_once_per_partition_list(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    real = hashlib.blake2b

    def counting(*args: object, **kwargs: object) -> object:
        made.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    parts = ListPartitions(["test/a", "test/b", "test/c"])
    mapping = rendezvous_mapping(identity, parts)
    monkeypatch.setattr(hashlib, "blake2b", counting)  # the module the mapping uses
    for k in keys(100):
        mapping(k)
    assert len(made) == 3
    parts.set(["test/a", "test/b"])  # a new list object: recomputed once
    for k in keys(100):
        assert mapping(k).journal in ("test/a", "test/b")
    assert len(made) == 5


# --- random ------------------------------------------------------------------------------


def test_random_mapping_covers_all_partitions_uniformly() -> None:
    names = [f"test/part-{i}" for i in range(5)]
    mapping = random_mapping(ListPartitions(names), random.Random(3))
    counts = collections.Counter(mapping(b"same key").journal for _ in range(5000))
    assert set(counts) == set(names)
    assert all(800 < n < 1200 for n in counts.values()), counts
    unseeded = random_mapping(FOOBAR)
    assert {unseeded(None).journal for _ in range(200)} == {
        p.journal for p in FOOBAR.current()}


# --- no partitions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda p: modulo_mapping(identity, p),
        lambda p: rendezvous_mapping(identity, p),
        lambda p: random_mapping(p),
    ],
    ids=["modulo", "rendezvous", "random"],
)
def test_no_partitions(make: object) -> None:
    parts = StaticPartitions(tutorial_specs(), parse_selector("prefix=nothing/"))
    mapping = make(parts)  # type: ignore[operator]
    with pytest.raises(NoPartitions, match="prefix=nothing/") as info:
        mapping(b"key")
    assert isinstance(info.value, GazetteError)
    assert info.value.selector == parse_selector("prefix=nothing/")

    # Partitions that appear later are used.
    changing = ListPartitions([])
    mapping = make(changing)  # type: ignore[operator]
    with pytest.raises(NoPartitions):
        mapping(b"key")
    changing.set(["test/now"])
    assert mapping(b"key") == Partition("test/now", "test/lines")
    changing.set([])
    with pytest.raises(NoPartitions):
        mapping(b"key")


def test_no_partitions_of_the_empty_selector() -> None:
    err = NoPartitions(Selector())
    assert str(err) == "no journals to publish to"
