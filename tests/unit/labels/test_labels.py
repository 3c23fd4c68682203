"""LabelSet: validation, multi-map semantics, the YAML list form and implicit labels."""

from __future__ import annotations

import copy
import pickle
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.labels import (
    EMPTY,
    ID,
    NAME,
    PREFIX,
    RESERVED_JOURNAL_LABELS,
    RESERVED_SHARD_LABELS,
    Label,
    LabelSet,
    journal_labels,
    shard_labels,
)
from gazette.names import LABEL_NAME_SYMBOLS, LABEL_VALUE_SYMBOLS

# --- strategies ------------------------------------------------------------------------

_ALNUM = string.ascii_letters + string.digits

label_names = st.builds(
    lambda first, mid, last: first + mid + last if mid else first,
    st.sampled_from(_ALNUM),
    st.text(_ALNUM + LABEL_NAME_SYMBOLS, max_size=6),
    st.sampled_from(_ALNUM),
)
label_values = st.text(_ALNUM + LABEL_VALUE_SYMBOLS, max_size=8)
label_sets = st.lists(st.tuples(label_names, label_values), max_size=8).map(LabelSet)


def _err(fn: Any, *args: Any, **kwargs: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        fn(*args, **kwargs)
    return info.value


# --- construction ----------------------------------------------------------------------


def test_pairs_are_sorted_and_deduplicated() -> None:
    ls = LabelSet([("b", "2"), ("a", "y"), Label("a", "x"), ("b", "2")])
    assert list(ls) == [Label("a", "x"), Label("a", "y"), Label("b", "2")]
    assert len(ls) == 3
    assert ls == LabelSet([("a", "y"), ("b", "2"), ("a", "x")])
    assert hash(ls) == hash(LabelSet([("a", "y"), ("b", "2"), ("a", "x")]))


def test_mapping_form() -> None:
    ls = LabelSet({"region": ["us-east-1", "eu-west-1"], "my-label": "", "tag": ()})
    assert ls == LabelSet([("region", "eu-west-1"), ("region", "us-east-1"), ("my-label", "")])
    assert "tag" not in ls
    assert LabelSet(ls) == ls
    assert LabelSet() == EMPTY and not EMPTY and len(EMPTY) == 0


@pytest.mark.parametrize(
    ("labels", "field", "reason"),
    [
        ([("a", "x"), ("b", "x"), ("-c", "x")], "labels[2].name", "begin and end"),
        ([("a", "x y")], "labels[0].value", "invalid character ' '"),
        ([("a", "x"), ("a=b", "")], "labels[1].name", "invalid character '='"),
        ([("", "x")], "labels[0].name", "must not be empty"),
        ([("a" * 65, "x")], "labels[0].name", "longer than 64"),
        ([("a", "x" * 1025)], "labels[0].value", "longer than 1024"),
        ([("a", 1)], "labels[0].value", "expected a string, got int"),
        ([("a", "x"), "ab"], "labels[1]", "expected a (name, value) pair, got str"),
        ([("a", "b", "c")], "labels[0]", "pair"),
        ({"a": 5}, "labels.a", "expected a string or strings, got int"),
        ({"a": ["x", "y z"]}, "labels.a[1]", "invalid character ' '"),
        ({"a b": "x"}, "labels", "invalid character ' '"),
        ("a=b", "labels", "expected pairs or a mapping of labels, got str"),
        (5, "labels", "got int"),
        (None, "labels", "got null"),
    ],
)
def test_constructor_errors_name_the_field(labels: Any, field: str, reason: str) -> None:
    err = _err(LabelSet, labels)
    assert err.field == field
    assert reason in err.reason


def test_constructor_field_prefix() -> None:
    assert _err(LabelSet, [("a", "$")], field="spec.labels").field == "spec.labels[0].value"


def test_immutable() -> None:
    ls = LabelSet([("a", "x")])
    with pytest.raises(AttributeError):
        ls.anything = 1  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(ls)) == ls
    assert copy.deepcopy(ls) == ls


# --- multi-map queries -----------------------------------------------------------------


def test_queries() -> None:
    ls = LabelSet([("region", "us-east-1"), ("region", "eu-west-1"), ("my-label", "")])
    assert ls.values("region") == ("eu-west-1", "us-east-1")
    assert ls.values("missing") == ()
    assert ls.value_of("region") == "eu-west-1"
    assert ls.value_of("my-label") == ""
    assert ls.value_of("missing") is None
    assert ls.names() == ("my-label", "region")
    assert "region" in ls and "my-label" in ls and "missing" not in ls
    assert Label("region", "us-east-1") in ls
    assert ("region", "us-west-2") not in ls
    assert 5 not in ls
    assert ls.as_dict() == {"my-label": ("",), "region": ("eu-west-1", "us-east-1")}
    assert repr(ls) == (
        "LabelSet([('my-label', ''), ('region', 'eu-west-1'), ('region', 'us-east-1')])"
    )
    assert eval(repr(ls)) == ls


def test_set_operations() -> None:
    a = LabelSet([("x", "1"), ("x", "2"), ("y", "")])
    b = LabelSet([("x", "2"), ("z", "3")])
    assert a.union(b) == a | b == LabelSet([("x", "1"), ("x", "2"), ("y", ""), ("z", "3")])
    assert a.intersection(b) == a & b == LabelSet([("x", "2")])
    assert a.difference(b) == a - b == LabelSet([("x", "1"), ("y", "")])
    assert a.union() == a
    with pytest.raises(TypeError):
        _ = a | 5


def test_derived_sets() -> None:
    a = LabelSet([("x", "1"), ("x", "2")])
    assert a.with_label("y") == LabelSet([("x", "1"), ("x", "2"), ("y", "")])
    assert a.with_label("x", "1") == a
    assert a.with_values("x", ["3"]) == LabelSet([("x", "3")])
    assert a.with_values("x", []) == EMPTY
    assert a.without("x") == EMPTY
    assert a.without("x", "1") == LabelSet([("x", "2")])
    assert a.without("nope") == a
    assert _err(a.with_label, "x y").field == "name"
    assert _err(a.with_label, "x", "$").field == "value"
    assert _err(a.with_values, "x", ["ok", "no way"]).field == "values[1]"


# --- YAML list form --------------------------------------------------------------------


def test_to_list_and_from_list() -> None:
    ls = LabelSet([("content-type", "application/x-ndjson"), ("my-label", "")])
    assert ls.to_list() == [
        {"name": "content-type", "value": "application/x-ndjson"},
        {"name": "my-label"},
    ]
    assert LabelSet.from_list(ls.to_list()) == ls
    assert LabelSet.from_list([{"name": "a", "value": None}]) == LabelSet([("a", "")])
    assert LabelSet.from_list([{"name": "b", "value": ""}, {"name": "a"}]) == LabelSet(
        [("a", ""), ("b", "")]
    )
    assert LabelSet.from_list([]) == EMPTY
    assert EMPTY.to_list() == []


def test_from_list_tutorial_spec() -> None:
    ls = LabelSet.from_list(
        [
            {"name": "app.gazette.dev/message-type", "value": "TestMessage"},
            {"name": "app.gazette.dev/region", "value": "local"},
            {"name": "app.gazette.dev/tag", "value": "demo"},
            {"name": "content-type", "value": "application/x-ndjson"},
        ]
    )
    assert ls.value_of("app.gazette.dev/message-type") == "TestMessage"
    assert len(ls) == 4


@pytest.mark.parametrize(
    ("obj", "field", "reason"),
    [
        ({"name": "a"}, "labels", "expected a list of labels, got dict"),
        ("a=b", "labels", "expected a list of labels, got str"),
        (None, "labels", "got null"),
        ([{"name": "a"}, "b"], "labels[1]", "expected a mapping with 'name' and 'value', got str"),
        ([["a", "b"]], "labels[0]", "got list"),
        ([{"value": "x"}], "labels[0].name", "is required"),
        ([{"name": None}], "labels[0].name", "is required"),
        (
            [{"name": "a"}, {"name": "b", "value": 7}],
            "labels[1].value",
            "expected a string, got int",
        ),
        ([{"name": 3}], "labels[0].name", "expected a string, got int"),
        ([{"name": "a", "value": ["x"]}], "labels[0].value", "got list"),
        ([{"name": "a b"}], "labels[0].name", "invalid character ' ' at 1"),
        ([{"name": "a", "value": "x,y"}], "labels[0].value", "invalid character ','"),
        ([{"name": "a.", "value": "x"}], "labels[0].name", "begin and end"),
        ([{"name": "a" * 65}], "labels[0].name", "longer than 64"),
        ([{"name": "a", "value": "v" * 1025}], "labels[0].value", "longer than 1024"),
        ([{"name": "a", "vaule": "x"}], "labels[0].vaule", "unknown field"),
        ([{"name": "a", 1: "x"}], "labels[0]", "keys must be strings"),
        (
            [{"name": "a", "value": "x"}, {"name": "b"}, {"name": "a", "value": "x"}],
            "labels[2]",
            "repeats labels[0] (a=x)",
        ),
    ],
)
def test_from_list_errors(obj: Any, field: str, reason: str) -> None:
    err = _err(LabelSet.from_list, obj)
    assert err.field == field
    assert reason in err.reason


def test_from_list_field_and_within() -> None:
    err = _err(LabelSet.from_list, [{"name": "$"}], "spec.labels")
    assert err.field == "spec.labels[0].name"
    assert _err(LabelSet.from_list, [{"name": "$"}]).within("journals[3]").field == (
        "journals[3].labels[0].name"
    )


@settings(max_examples=150, deadline=None)
@given(label_sets)
def test_list_round_trip(ls: LabelSet) -> None:
    assert LabelSet.from_list(ls.to_list()) == ls
    assert LabelSet(ls.as_dict()) == ls
    assert LabelSet(list(ls)) == ls
    assert list(ls) == sorted(set(ls))


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=6)
    | st.sampled_from(["name", "value", "a", "a-b", "", "x/y"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["name", "value", "other"]) | st.text(max_size=3), children, max_size=3
        )
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(json_like | st.lists(st.dictionaries(st.sampled_from(["name", "value"]), json_like)))
def test_from_list_never_raises_other_errors(obj: object) -> None:
    try:
        ls = LabelSet.from_list(obj)
    except ValidationError as err:
        assert err.field.startswith("labels")
    else:
        assert LabelSet.from_list(ls.to_list()) == ls


# --- implicit labels -------------------------------------------------------------------


def test_reserved_labels() -> None:
    assert (NAME, PREFIX, ID) == ("name", "prefix", "id")
    assert frozenset({"name", "prefix"}) == RESERVED_JOURNAL_LABELS
    assert frozenset({"id", "prefix"}) == RESERVED_SHARD_LABELS


def test_journal_labels() -> None:
    user = LabelSet([("my-label", "")])
    ls = journal_labels("foo/bar/baz", user)
    assert ls.values("name") == ("foo/bar/baz",)
    assert ls.values("prefix") == ("foo/", "foo/bar/")
    assert "my-label" in ls
    assert journal_labels("flat").values("prefix") == ()
    # Implicit labels replace any given ones.
    spoof = LabelSet([("name", "other"), ("prefix", "x/")])
    assert journal_labels("a%20b/c", spoof).names() == ("name", "prefix")
    assert journal_labels("a%20b/c", spoof).values("name") == ("a%20b/c",)
    assert journal_labels("a%20b/c", spoof).values("prefix") == ("a%20b/",)
    err = _err(journal_labels, "/bad")
    assert err.field == "name"
    # Journal names keep to label value characters, so a selector can name any journal.
    assert "'='" in _err(journal_labels, "a=b/c").reason


def test_shard_labels() -> None:
    ls = shard_labels("word-count/part-000", LabelSet([("id", "x"), ("tier", "gold")]))
    assert ls == LabelSet(
        [("id", "word-count/part-000"), ("prefix", "word-count/"), ("tier", "gold")]
    )
    assert _err(shard_labels, "").field == "id"
