"""Selectors: syntax, errors, canonical format, matching and the tutorial's examples."""

from __future__ import annotations

import pickle
import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.labels import (
    EMPTY,
    LabelSet,
    Selector,
    journal_labels,
    parse_selector,
)
from gazette.names import LABEL_NAME_SYMBOLS, LABEL_VALUE_SYMBOLS


def sel(include: list[tuple[str, str]] = [], exclude: list[tuple[str, str]] = []) -> Selector:  # noqa: B006
    return Selector(LabelSet(include), LabelSet(exclude))


def parse_error(text: object, field: str = "selector") -> ValidationError:
    with pytest.raises(ValidationError) as info:
        parse_selector(text, field)  # type: ignore[arg-type]
    assert info.value.field == field
    return info.value


# --- syntax ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "canonical"),
    [
        ("", sel(), ""),
        ("   \t\n", sel(), ""),
        ("a=b", sel([("a", "b")]), "a=b"),
        (" a = b ", sel([("a", "b")]), "a=b"),
        ("a==b", sel([("a", "b")]), "a=b"),
        ("a!=b", sel(exclude=[("a", "b")]), "a!=b"),
        ("a in (x, y)", sel([("a", "x"), ("a", "y")]), "a in (x, y)"),
        ("a in(y,x)", sel([("a", "x"), ("a", "y")]), "a in (x, y)"),
        ("a in (x)", sel([("a", "x")]), "a=x"),
        ("a notin (x, y)", sel(exclude=[("a", "x"), ("a", "y")]), "a notin (x, y)"),
        ("a not in (y, x)", sel(exclude=[("a", "x"), ("a", "y")]), "a notin (x, y)"),
        ("a", sel([("a", "")]), "a"),
        ("!a", sel(exclude=[("a", "")]), "!a"),
        ("! a", sel(exclude=[("a", "")]), "!a"),
        ("a=x, a=y", sel([("a", "x"), ("a", "y")]), "a in (x, y)"),
        ("a=x,a=x", sel([("a", "x")]), "a=x"),
        ("a=x, a", sel([("a", ""), ("a", "x")]), "a, a=x"),
        ("a in (x, y), a", sel([("a", ""), ("a", "x"), ("a", "y")]), "a, a in (x, y)"),
        ("a!=x, !a", sel(exclude=[("a", ""), ("a", "x")]), "!a, a!=x"),
        (
            "z=1, b notin (q, p), a, !c, b=r",
            sel([("z", "1"), ("a", ""), ("b", "r")], [("b", "p"), ("b", "q"), ("c", "")]),
            "a, b=r, b notin (p, q), !c, z=1",
        ),
        (
            "in in (in), notin notin (notin)",
            sel([("in", "in")], [("notin", "notin")]),
            "in=in, notin!=notin",
        ),
        ("not in (x)", sel([("not", "x")]), "not=x"),
        ("not, notin", sel([("not", ""), ("notin", "")]), "not, notin"),
        (
            "app.gazette.dev/message-type=TestMessage",
            sel([("app.gazette.dev/message-type", "TestMessage")]),
            "app.gazette.dev/message-type=TestMessage",
        ),
        (
            "content-type in (application/x-ndjson, text/csv+x:1@y%2)",
            sel([("content-type", "application/x-ndjson"), ("content-type", "text/csv+x:1@y%2")]),
            "content-type in (application/x-ndjson, text/csv+x:1@y%2)",
        ),
    ],
)
def test_syntax(text: str, expected: Selector, canonical: str) -> None:
    parsed = parse_selector(text)
    assert parsed == expected
    assert parsed.format() == str(parsed) == canonical
    assert parse_selector(canonical) == parsed
    assert Selector.parse(text) == parsed


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a=", "empty value after '=' (use 'a' to select on existence) at 2 in \"a=\""),
        ("a=, b", "empty value after '=' (use 'a' to select on existence) at 2"),
        ("a!=", "empty value after '!=' (use '!a' to select on absence) at 3"),
        ("a in (x, y", "expected ',' or ')', found end of selector at 10 in \"a in (x, y\""),
        ("a in (x y)", "expected ',' or ')', found 'y' at 8"),
        ("a in ()", "expected at least one value in '( )' at 6"),
        ("a in (x,)", "expected a label value, found ')' at 8"),
        ("a in (, x)", "expected a label value, found ',' at 6"),
        ("a in x", "expected '(', found 'x' at 5"),
        ("a notin", "expected '(', found end of selector at 7"),
        ("a not (x)", "expected 'in' after 'not', found '(' at 6"),
        ("a not", "expected 'in' after 'not', found end of selector at 5"),
        ("a b", "expected '=', '!=', 'in', 'notin' or ',' after label name 'a', found 'b' at 2"),
        ("a (x)", "found '(' at 2"),
        ("a=b c", "expected ',' or end of selector, found 'c' at 4"),
        ("!a=b", "expected ',' or end of selector, found '=' at 2"),
        ("a=b,", "expected a label name, found end of selector at 4"),
        (",a=b", "expected a label name, found ',' at 0"),
        ("a=b,,c", "expected a label name, found ',' at 4"),
        ("!", "expected a label name, found end of selector at 1"),
        ("!!a", "expected a label name, found '!' at 1"),
        ("=b", "expected a label name, found '=' at 0"),
        ("a===b", "expected a label value, found '=' at 3"),
        ("a=(x)", "expected a label value, found '(' at 2"),
        ("a=b$c", "unexpected character '$' at 3 in \"a=b$c\""),
        ("a=b\x00", "unexpected character U+0000 at 3"),
        ("région=x", "unexpected character 'é' at 1"),
        ('a="b"', "unexpected character '\"' at 2"),
        ("a+b=c", "label name 'a+b' has invalid character '+' at 1"),
        ("x, ab:c", "label name 'ab:c' has invalid character ':' at 5"),
        ("-a=b", "invalid label name at 0 in \"-a=b\": '-a' must begin and end with a letter"),
        ("x, a/", "invalid label name at 3"),
        ("a" * 65, "invalid label name at 0"),
        ("a=" + "v" * 1025, 'invalid label value at 2 near "a=vvv'),
    ],
)
def test_syntax_errors(text: str, reason: str) -> None:
    err = parse_error(text)
    assert reason in err.reason
    assert re.search(r" at \d+ (in|near) \"", err.reason), err.reason


def test_error_field_and_long_text() -> None:
    err = parse_error("a=b$", "journals.selector")
    assert str(err) == "journals.selector: unexpected character '$' at 3 in \"a=b$\""
    text = "a=b, " * 100 + "c=$"
    err = parse_error(text)
    assert f'at {len(text) - 1} near "…' in err.reason
    assert len(err.reason) < 200


@pytest.mark.parametrize("value", [None, 5, b"a=b", ["a=b"]])
def test_non_string_input(value: object) -> None:
    assert "expected a string, got" in parse_error(value).reason


def test_selector_value_semantics() -> None:
    s = parse_selector("b!=1, a=x")
    assert s.include == LabelSet([("a", "x")])
    assert s.exclude == LabelSet([("b", "1")])
    assert s == Selector(LabelSet([("a", "x")]), LabelSet([("b", "1")]))
    assert hash(s) == hash(parse_selector("a=x, b!=1"))
    assert s != parse_selector("a=x")
    assert s != "a=x, b!=1"
    assert repr(s) == "Selector.parse('a=x, b!=1')"
    assert eval(repr(s)) == s
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(AttributeError):
        s.include = EMPTY  # type: ignore[misc]
    with pytest.raises(ValidationError) as info:
        Selector({"a": "x"})  # type: ignore[arg-type]
    assert info.value.field == "include"


# --- matching --------------------------------------------------------------------------


def test_empty_selector_matches_everything() -> None:
    assert Selector().matches(EMPTY)
    assert Selector().matches(LabelSet([("a", "x")]))


@pytest.mark.parametrize(
    ("selector", "matches", "rejects"),
    [
        ("a=x", [{"a": "x"}, {"a": ["x", "y"]}], [{}, {"a": "y"}, {"a": ""}, {"b": "x"}]),
        ("a!=x", [{}, {"a": "y"}, {"a": ""}, {"b": "x"}], [{"a": "x"}, {"a": ["x", "y"]}]),
        ("a in (x, y)", [{"a": "x"}, {"a": "y"}, {"a": ["y", "z"]}], [{}, {"a": "z"}]),
        ("a notin (x, y)", [{}, {"a": "z"}, {"a": ""}], [{"a": ["z", "y"]}, {"a": "x"}]),
        ("a", [{"a": ""}, {"a": "x"}, {"a": ["x", "y"]}], [{}, {"b": ""}]),
        ("!a", [{}, {"b": "x"}], [{"a": ""}, {"a": "x"}]),
        ("a, a=x", [{"a": "y"}, {"a": "x"}], [{}]),  # included "" means any value
        ("!a, a!=x", [{}], [{"a": "y"}, {"a": ""}]),  # excluded "" means absent
        ("a=x, a!=x", [], [{}, {"a": "x"}, {"a": ["x", "y"]}]),
        ("a=x, b", [{"a": "x", "b": "q"}], [{"a": "x"}, {"b": "q"}]),
        ("a=x, !b", [{"a": "x"}], [{"a": "x", "b": "q"}]),
    ],
)
def test_matching(
    selector: str,
    matches: list[dict[str, str | list[str]]],
    rejects: list[dict[str, str | list[str]]],
) -> None:
    s = parse_selector(selector)
    for labels in matches:
        assert s.matches(LabelSet(labels)), labels
    for labels in rejects:
        assert not s.matches(LabelSet(labels)), labels


def test_multi_map_semantics() -> None:
    both = LabelSet([("region", "us-east-1"), ("region", "eu-west-1")])
    assert parse_selector("region=us-east-1").matches(both)
    assert parse_selector("region=eu-west-1").matches(both)
    assert parse_selector("region in (ap-south-1, eu-west-1)").matches(both)
    assert not parse_selector("region!=us-east-1").matches(both)
    assert not parse_selector("region notin (ap-south-1, eu-west-1)").matches(both)
    assert parse_selector("region notin (ap-south-1)").matches(both)


# --- the broker tutorial ---------------------------------------------------------------

TUTORIAL_JOURNALS = {
    "example/journal": LabelSet.from_list(
        [
            {"name": "app.gazette.dev/message-type", "value": "TestMessage"},
            {"name": "app.gazette.dev/region", "value": "local"},
            {"name": "app.gazette.dev/tag", "value": "demo"},
            {"name": "content-type", "value": "application/x-ndjson"},
        ]
    ),
    **{
        f"foobar/part-00{i}": LabelSet.from_list(
            [{"name": "content-type", "value": "application/x-ndjson"}, {"name": "my-label"}]
        )
        for i in range(3)
    },
}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("prefix=example/", ["example/journal"]),
        ("prefix=foobar/", ["foobar/part-000", "foobar/part-001", "foobar/part-002"]),
        ("app.gazette.dev/message-type=TestMessage", ["example/journal"]),
        ("my-label", ["foobar/part-000", "foobar/part-001", "foobar/part-002"]),
        ("name in (example/journal, foobar/part-001)", ["example/journal", "foobar/part-001"]),
        ("prefix=foobar/, name not in (foobar/part-001)", ["foobar/part-000", "foobar/part-002"]),
        ("", ["example/journal", "foobar/part-000", "foobar/part-001", "foobar/part-002"]),
        ("content-type=application/x-ndjson, !my-label", ["example/journal"]),
    ],
)
def test_tutorial_examples(selector: str, expected: list[str]) -> None:
    s = parse_selector(selector)
    listed = [n for n, labels in TUTORIAL_JOURNALS.items() if s.matches(journal_labels(n, labels))]
    assert listed == expected


def test_tutorial_selector_on_bare_journal() -> None:
    s = parse_selector("prefix=foobar/, name not in (foobar/part-001)")
    assert s.matches(journal_labels("foobar/part-000", LabelSet()))
    assert not s.matches(journal_labels("foobar/part-001", LabelSet()))
    assert not s.matches(journal_labels("foobarbaz/part-000", LabelSet()))


@pytest.mark.parametrize("text", ["prefix=foobar/part-000", "prefix in (foobar/, x)",
                                  "prefix!=foobar", "a=b, prefix notin (x)"])
def test_a_prefix_that_is_no_folder_is_refused(text: str) -> None:
    # It would select nothing, silently: an export job read 0 rows with one.
    with pytest.raises(ValidationError, match=r"a prefix ends with '/'.*use name="):
        parse_selector(text)


# --- properties ------------------------------------------------------------------------

_ALNUM = string.ascii_letters + string.digits

label_names = st.one_of(
    st.sampled_from(["a", "b", "in", "not", "notin", "name", "prefix", "app.gazette.dev/x"]),
    st.builds(
        lambda first, mid, last: first + mid + last if mid else first,
        st.sampled_from(_ALNUM),
        st.text(_ALNUM + LABEL_NAME_SYMBOLS, max_size=5),
        st.sampled_from(_ALNUM),
    ),
)
label_values = st.one_of(
    st.sampled_from(["", "", "x", "y", "in", "notin", "foobar/"]),
    st.text(_ALNUM + LABEL_VALUE_SYMBOLS, max_size=6),
)
# A prefix is a folder: its values end with '/' (a selector refuses any other).
label_pairs = st.tuples(label_names, label_values).map(
    lambda nv: (nv[0], nv[1] + "/" if nv[0] == "prefix" and nv[1] and not nv[1].endswith("/")
                else nv[1]))
label_sets = st.lists(label_pairs, max_size=6).map(LabelSet)
selectors = st.builds(Selector, label_sets, label_sets)

# Text built from the grammar's own pieces, so that fuzzing reaches deep into the parser.
grammar_text = st.lists(
    st.sampled_from(
        [
            "a",
            "b",
            "x",
            "in",
            "not",
            "notin",
            "=",
            "==",
            "!=",
            "!",
            ",",
            "(",
            ")",
            " ",
            ", ",
            "-",
            "/",
            ".",
            "$",
            "é",
            "\t",
            "a-",
            "x:y",
        ]
    ),
    max_size=14,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(selectors)
def test_format_round_trip(s: Selector) -> None:
    text = s.format()
    assert parse_selector(text) == s
    assert parse_selector(text).format() == text


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=30), grammar_text))
def test_parse_raises_only_validation_error(text: str) -> None:
    try:
        s = parse_selector(text)
    except ValidationError as err:
        assert err.field == "selector"
        assert re.search(r" at \d+ (in|near) \"", err.reason), err.reason
    else:
        canonical = str(s)
        assert parse_selector(canonical) == s
        assert str(parse_selector(canonical)) == canonical


@settings(max_examples=200, deadline=None)
@given(selectors, label_sets)
def test_matches_agrees_with_definition(s: Selector, labels: LabelSet) -> None:
    def included(name: str) -> bool:
        wanted = s.include.values(name)
        have = labels.values(name)
        return bool(have) and ("" in wanted or any(v in wanted for v in have))

    def excluded(name: str) -> bool:
        banned = s.exclude.values(name)
        have = labels.values(name)
        return bool(have) and ("" in banned or any(v in banned for v in have))

    expected = all(included(n) for n in s.include.names()) and not any(
        excluded(n) for n in s.exclude.names()
    )
    assert s.matches(labels) == expected
