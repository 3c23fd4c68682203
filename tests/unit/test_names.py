"""Names: journal names, shard ids, label names and values, prefixes, etcd prefixes."""

from __future__ import annotations

import pytest

from gazette import names
from gazette.errors import ValidationError, short_repr


def _fails(fn: object, value: object, field: str, phrase: str) -> ValidationError:
    """Call ``fn(value, field)``; it must raise a ValidationError on `field` saying `phrase`."""
    assert callable(fn)
    with pytest.raises(ValidationError) as info:
        fn(value, field)
    assert info.value.field == field
    assert phrase in info.value.reason, info.value.reason
    return info.value


# --- journal names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "example/journal",
        "foobar/part-000",
        "ab",
        "a/b/c/d",
        "with.dots/and_under+plus%25",
        "x" * names.MAX_JOURNAL_NAME_LEN,
        "a..b/c",  # '..' inside a component is no '..' component
    ],
)
def test_valid_journal_names(name: str) -> None:
    assert names.validate_journal_name(name) == name


@pytest.mark.parametrize(
    ("name", "phrase"),
    [
        ("", "shorter than 2"),
        ("a", "shorter than 2"),
        ("x" * (names.MAX_JOURNAL_NAME_LEN + 1), "longer than 512"),
        ("a//b", "must not contain '//'"),
        ("a/../b", "'..' component"),
        ("a/./b", "'.' component"),
        ("..", "'..' component"),
        ("/abs/name", "must not begin with '/'"),
        ("trailing/", "must not end with '/'"),
        ("date=2024/x", "invalid character '='"),
        ("has space", "invalid character ' '"),
        ("a#b", "invalid character '#'"),
        ("a,b", "invalid character ','"),
        ("tab\there", "invalid character U+0009"),
        ("caf\u00e9/x", "invalid character"),
    ],
)
def test_invalid_journal_names(name: str, phrase: str) -> None:
    _fails(names.validate_journal_name, name, "name", phrase)


@pytest.mark.parametrize("value", [None, 12, b"a/b", ["a/b"], True])
def test_journal_name_must_be_a_string(value: object) -> None:
    _fails(names.validate_journal_name, value, "sources[1].journal", "expected a string")


def test_default_fields_are_name_and_id() -> None:
    with pytest.raises(ValidationError) as info:
        names.validate_journal_name("a//b")
    assert info.value.field == "name"
    with pytest.raises(ValidationError) as info:
        names.validate_shard_id("")
    assert info.value.field == "id"


# --- shard ids --------------------------------------------------------------------------


@pytest.mark.parametrize("shard_id", ["s", "word-count/part-000", "x" * names.MAX_SHARD_ID_LEN])
def test_valid_shard_ids(shard_id: str) -> None:
    assert names.validate_shard_id(shard_id) == shard_id


@pytest.mark.parametrize(
    ("shard_id", "phrase"),
    [
        ("", "must not be empty"),
        ("x" * (names.MAX_SHARD_ID_LEN + 1), "longer than 512"),
        ("a//b", "'//'"),
        ("a/..", "'..' component"),
        ("/a", "must not begin with '/'"),
        ("a/", "must not end with '/'"),
        ("a=b", "invalid character '='"),
        ("a#0", "invalid character '#'"),
    ],
)
def test_invalid_shard_ids(shard_id: str, phrase: str) -> None:
    _fails(names.validate_shard_id, shard_id, "id", phrase)


# --- labels -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a", "content-type", "app.gazette.dev/message-type", "my_label", "x" * 64]
)
def test_valid_label_names(name: str) -> None:
    assert names.validate_label_name(name) == name


@pytest.mark.parametrize(
    ("name", "phrase"),
    [
        ("", "must not be empty"),
        ("x" * 65, "longer than 64"),
        ("-lead", "begin and end with a letter or digit"),
        ("trail.", "begin and end with a letter or digit"),
        ("/", "begin and end with a letter or digit"),
        ("has space", "invalid character ' '"),
        ("a=b", "invalid character '='"),
        ("a:b", "invalid character ':'"),
        ("a,b", "invalid character ','"),
        ("a!b", "invalid character '!'"),
        ("a(b)", "invalid character '('"),
    ],
)
def test_invalid_label_names(name: str, phrase: str) -> None:
    _fails(names.validate_label_name, name, "labels[0].name", phrase)


@pytest.mark.parametrize(
    "value", ["", "TestMessage", "application/x-ndjson", "us-east-1", "a:b@c%d+e", "x" * 1024]
)
def test_valid_label_values(value: str) -> None:
    assert names.validate_label_value(value) == value


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ("x" * 1025, "longer than 1024"),
        ("a b", "invalid character ' '"),
        ("a=b", "invalid character '='"),
        ("a,b", "invalid character ','"),
        ("(a)", "invalid character '('"),
        ("a!", "invalid character '!'"),
        ("nl\n", "invalid character U+000A"),
    ],
)
def test_invalid_label_values(value: str, phrase: str) -> None:
    _fails(names.validate_label_value, value, "labels[2].value", phrase)


@pytest.mark.parametrize("value", [None, 1, 1.5, ["a"], {"a": 1}])
def test_label_parts_must_be_strings(value: object) -> None:
    _fails(names.validate_label_name, value, "labels[0].name", "expected a string")
    _fails(names.validate_label_value, value, "labels[0].value", "expected a string")


# --- prefixes ---------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "foobar/", "a/b/", "x" * 511 + "/"])
def test_valid_prefixes(prefix: str) -> None:
    assert names.validate_prefix(prefix) == prefix


@pytest.mark.parametrize(
    ("prefix", "phrase"),
    [
        ("foobar", "must end with '/'"),
        ("/", "must not be empty"),
        ("a//", "must not end with '/'"),
        ("/a/", "must not begin with '/'"),
        ("a/../", "'..' component"),
        ("x" * 512 + "/", "longer than 511"),
        ("a=b/", "invalid character '='"),
    ],
)
def test_invalid_prefixes(prefix: str, phrase: str) -> None:
    _fails(names.validate_prefix, prefix, "prefix", phrase)


@pytest.mark.parametrize("value", [None, 3, ["a/"]])
def test_prefix_must_be_a_string(value: object) -> None:
    _fails(names.validate_prefix, value, "prefix", "expected a string")


# --- etcd prefixes ----------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["/gazette/cluster", "/a", "/gazette/consumers/app-1"])
def test_valid_etcd_prefixes(prefix: str) -> None:
    assert names.validate_etcd_prefix(prefix) == prefix


@pytest.mark.parametrize(
    ("prefix", "phrase"),
    [
        ("gazette/cluster", "must begin with '/'"),
        ("", "must begin with '/'"),
        ("/", "must not be empty"),
        ("/gazette/", "must not end with '/'"),
        ("//gazette", "must not begin with '/'"),
        ("/a//b", "'//'"),
        ("/a/../b", "'..' component"),
        ("/a#b", "invalid character '#'"),
    ],
)
def test_invalid_etcd_prefixes(prefix: str, phrase: str) -> None:
    _fails(names.validate_etcd_prefix, prefix, "hint_prefix", phrase)


@pytest.mark.parametrize("value", [None, 7, b"/a"])
def test_etcd_prefix_must_be_a_string(value: object) -> None:
    _fails(names.validate_etcd_prefix, value, "hint_prefix", "expected a string")


# --- tokens -----------------------------------------------------------------------------


def test_token_reports_position_and_allowed_symbols() -> None:
    err = _fails(
        lambda v, f: names.validate_token(v, f, "-_", 1, 8), "ab*c", "zone", "at 2"
    )
    assert "'-_'" in err.reason


def _deep(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


def test_short_repr_is_bounded_and_safe() -> None:
    assert short_repr("O_APPEND") == "'O_APPEND'"
    assert short_repr(None) == "None" and short_repr(12) == "12"
    assert len(short_repr("x" * 10**6)) <= 200
    assert len(short_repr(list(range(10**6)))) < 100
    assert short_repr(10**5000) == "<16610-bit integer>"  # repr() would raise ValueError
    assert short_repr(_deep(100_000)) == "[[[[...]]]]"  # repr() would raise RecursionError

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert short_repr(Broken()).startswith("<Broken")


def test_huge_values_give_short_messages() -> None:
    err = _fails(names.validate_prefix, "x" * 10**6, "prefix", "must end with '/'")
    assert len(err.reason) < 300
    err = _fails(names.validate_etcd_prefix, "x" * 10**6, "hint_prefix", "must begin with '/'")
    assert len(err.reason) < 300
    err = _fails(names.validate_journal_name, "x" * 10**6, "name", "longer than 512")
    assert len(err.reason) < 100


def test_validation_error_within_builds_paths() -> None:
    err = ValidationError("length", "too small")
    assert err.within("fragment").field == "fragment.length"
    assert err.within("").field == "length"
    assert ValidationError("[1]", "bad").within("stores").field == "stores[1]"
    assert ValidationError("", "bad").within("suspend").field == "suspend"
    assert str(err.within("fragment")) == "fragment.length: too small"
    assert str(ValidationError("", "just a reason")) == "just a reason"
