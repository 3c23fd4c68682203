"""Spec trees: expand to flat specs, fold back into the smallest tree, YAML in and out."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.local.tutorial import FOOBAR_TREE_YAML
from gazette.spectree import (
    JOURNALS,
    MAX_DEPTH,
    SHARDS,
    canonicalize,
    dump_yaml,
    expand,
    fold,
    load_yaml,
    normalize,
)

TUTORIAL = FOOBAR_TREE_YAML

TUTORIAL_LABELS = [
    {"name": "content-type", "value": "application/x-ndjson"},
    {"name": "my-label"},
]
TUTORIAL_FRAGMENT = {
    "length": 4096,
    "compression_codec": "GZIP",
    "stores": ["file:///"],
    "refresh_interval": "1m0s",
    "flush_interval": "1m0s",
}

EXAMPLE_JOURNAL = {
    "name": "example/journal",
    "replication": 1,
    "labels": [
        {"name": "app.gazette.dev/message-type", "value": "TestMessage"},
        {"name": "app.gazette.dev/region", "value": "local"},
        {"name": "app.gazette.dev/tag", "value": "demo"},
        {"name": "content-type", "value": "application/x-ndjson"},
    ],
    "fragment": {
        "length": 131072,
        "compression_codec": "SNAPPY",
        "stores": ["file:///"],
        "refresh_interval": "1m0s",
    },
}


def tutorial_specs() -> list[dict[str, Any]]:
    return [
        {
            "name": f"foobar/part-00{i}",
            "replication": 1,
            "labels": TUTORIAL_LABELS,
            "fragment": TUTORIAL_FRAGMENT,
        }
        for i in range(3)
    ]


def same(a: object, b: object) -> bool:
    """Exact equality: types (True vs 1) and key order too."""
    return repr(a) == repr(b)


def size(data: object, name_key: str) -> int:
    """Scalar entries of specs or a tree, not counting names and the tree's own structure."""
    if isinstance(data, dict):
        return sum(size(v, name_key) for k, v in data.items() if k != name_key)
    if isinstance(data, list):
        return sum(size(v, name_key) for v in data) if data else 1
    return 1


def error_of(fn: Any, *args: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        fn(*args)
    return info.value


# --- expand ----------------------------------------------------------------------------


def test_tutorial_tree_expands_to_three_journals() -> None:
    specs = load_yaml(TUTORIAL, JOURNALS)
    assert [s["name"] for s in specs] == [f"foobar/part-00{i}" for i in range(3)]
    for spec in specs:
        assert spec == {
            "name": spec["name"],
            "replication": 1,
            "labels": TUTORIAL_LABELS,
            "fragment": TUTORIAL_FRAGMENT,
        }
        assert list(spec) == ["name", "replication", "labels", "fragment"]
        assert list(spec["fragment"]) == [
            "length",
            "compression_codec",
            "stores",
            "refresh_interval",
            "flush_interval",
        ]
    # Outputs never share mutable parts with each other.
    specs[0]["fragment"]["stores"].append("s3://x/")
    assert specs[1]["fragment"]["stores"] == ["file:///"]


def test_child_overrides_merge_nearer_wins() -> None:
    tree = yaml.safe_load(TUTORIAL)
    tree["children"][1].update(
        {
            "fragment": {"length": 8192, "stores": ["s3://bucket/"]},
            "replication": 3,
            "labels": [{"name": "my-label", "value": "x"}, {"name": "content-type"}],
        }
    )
    specs = expand(tree, JOURNALS)
    assert specs[0]["fragment"] == TUTORIAL_FRAGMENT
    child = specs[1]
    assert child["replication"] == 3
    # Nested mappings merge key by key; lists such as stores are replaced whole.
    assert child["fragment"] == {**TUTORIAL_FRAGMENT, "length": 8192, "stores": ["s3://bucket/"]}
    # Labels are a set union of (name, value), sorted, value omitted when empty.
    assert child["labels"] == [
        {"name": "content-type"},
        {"name": "content-type", "value": "application/x-ndjson"},
        {"name": "my-label"},
        {"name": "my-label", "value": "x"},
    ]


def test_labels_deduplicate_and_empty_lists_vanish() -> None:
    specs = expand(
        {
            "name": "a/",
            "labels": [{"name": "x", "value": ""}, {"name": "x"}, {"name": "y", "value": None}],
            "children": [
                {"name": "a/1", "labels": [{"name": "x"}]},
                {"name": "a/2", "labels": []},
            ],
        },
        JOURNALS,
    )
    assert specs[0]["labels"] == [{"name": "x"}, {"name": "y"}]
    assert specs[1]["labels"] == [{"name": "x"}, {"name": "y"}]
    assert "labels" not in expand({"name": "b", "labels": []}, JOURNALS)[0]


def test_null_and_empty_mappings_mean_unset() -> None:
    specs = expand(
        {
            "name": "a/",
            "replication": 2,
            "fragment": {"length": 1},
            "children": [{"name": "a/1", "replication": None, "fragment": {"length": None}}],
        },
        JOURNALS,
    )
    assert specs == [{"name": "a/1", "replication": 2, "fragment": {"length": 1}}]
    assert expand({"name": "x", "fragment": {"a": {}}, "suspend": None}, JOURNALS) == [
        {"name": "x"}
    ]


def test_revision_stays_on_leaves_and_unknown_keys_follow_known_ones() -> None:
    tree = {
        "name": "a/",
        "zeta": 1,
        "alpha": {"b": 1, "a": 2},
        "replication": 2,
        "children": [
            {"name": "a/1", "revision": 7, "delete": True},
            {"name": "a/2", "revision": 7},
        ],
    }
    specs = expand(tree, JOURNALS)
    assert list(specs[0]) == ["name", "replication", "revision", "delete", "alpha", "zeta"]
    assert list(specs[0]["alpha"]) == ["a", "b"]
    assert [s["revision"] for s in specs] == [7, 7]
    folded = fold(specs, JOURNALS)
    # Equal revisions are never hoisted: they belong to each leaf.
    assert "revision" not in folded
    assert [c["revision"] for c in folded["children"]] == [7, 7]
    assert folded["replication"] == 2
    assert folded["children"][0] == {"name": "a/1", "revision": 7, "delete": True}


def test_unnamed_root_group_and_lists_of_trees() -> None:
    tree = {
        "replication": 2,
        "children": [{"name": "x"}, {"name": "a/", "children": [{"name": "a/y"}]}],
    }
    assert expand(tree, JOURNALS) == [
        {"name": "a/y", "replication": 2},
        {"name": "x", "replication": 2},
    ]
    assert expand([{"name": "b"}, {"name": "a"}], JOURNALS) == [{"name": "a"}, {"name": "b"}]
    assert expand([], JOURNALS) == []
    assert expand({"name": "", "children": []}, JOURNALS) == []


# --- fold ------------------------------------------------------------------------------


def test_fold_gives_back_the_tutorial_tree() -> None:
    folded = fold(tutorial_specs(), JOURNALS)
    assert same(folded, canonicalize(yaml.safe_load(TUTORIAL), JOURNALS))
    assert folded == {
        "name": "foobar/",
        "replication": 1,
        "labels": TUTORIAL_LABELS,
        "fragment": TUTORIAL_FRAGMENT,
        "children": [{"name": f"foobar/part-00{i}"} for i in range(3)],
    }


def test_fold_hoists_what_is_common_only() -> None:
    specs = tutorial_specs()
    specs[1] = {
        **specs[1],
        "fragment": {**TUTORIAL_FRAGMENT, "length": 8192},
        "labels": [*TUTORIAL_LABELS, {"name": "extra"}],
    }
    specs[2] = {**specs[2], "labels": TUTORIAL_LABELS[:1]}
    folded = fold(specs, JOURNALS)
    assert folded["labels"] == TUTORIAL_LABELS[:1]
    assert folded["fragment"] == {k: v for k, v in TUTORIAL_FRAGMENT.items() if k != "length"}
    assert folded["children"] == [
        {"name": "foobar/part-000", "labels": [{"name": "my-label"}], "fragment": {"length": 4096}},
        {
            "name": "foobar/part-001",
            "labels": [{"name": "extra"}, {"name": "my-label"}],
            "fragment": {"length": 8192},
        },
        {"name": "foobar/part-002", "fragment": {"length": 4096}},
    ]
    assert same(expand(folded, JOURNALS), normalize(specs, JOURNALS))


def test_fold_of_two_prefixes_has_an_unnamed_root() -> None:
    specs = [EXAMPLE_JOURNAL, *tutorial_specs()]
    folded = fold(specs, JOURNALS)
    assert folded["name"] == ""
    assert folded["replication"] == 1
    assert folded["labels"] == [{"name": "content-type", "value": "application/x-ndjson"}]
    assert folded["fragment"] == {"stores": ["file:///"], "refresh_interval": "1m0s"}
    example, foobar = folded["children"]
    assert example["name"] == "example/journal"
    assert example["fragment"] == {"length": 131072, "compression_codec": "SNAPPY"}
    assert foobar["name"] == "foobar/"
    assert foobar["labels"] == [{"name": "my-label"}]
    assert foobar["children"] == [{"name": f"foobar/part-00{i}"} for i in range(3)]
    assert same(expand(folded, JOURNALS), normalize(specs, JOURNALS))


def test_fold_single_and_no_specs() -> None:
    assert same(fold([EXAMPLE_JOURNAL], JOURNALS), normalize([EXAMPLE_JOURNAL], JOURNALS)[0])
    assert fold([], JOURNALS) == {"name": "", "children": []}
    assert dump_yaml(fold([], JOURNALS), JOURNALS) == ""
    assert dump_yaml([], JOURNALS) == ""


def test_fold_groups_only_where_names_branch() -> None:
    names = ["a/b/c/x", "a/b/c/y", "a/b/z", "a/b", "a/q/r/s"]
    folded = fold([{"name": n, "suspend": {"level": "FULL"}} for n in names], JOURNALS)
    assert folded == {
        "name": "a/",
        "suspend": {"level": "FULL"},
        "children": [
            {"name": "a/b"},
            {
                "name": "a/b/",
                "children": [
                    {"name": "a/b/c/", "children": [{"name": "a/b/c/x"}, {"name": "a/b/c/y"}]},
                    {"name": "a/b/z"},
                ],
            },
            {"name": "a/q/r/s"},
        ],
    }


def test_fold_keeps_deep_names_within_the_depth_limit() -> None:
    names = ["/".join(["d"] * i + ["x"]) for i in range(2 * MAX_DEPTH)]
    specs = [{"name": n, "replication": 1} for n in names]
    folded = fold(specs, JOURNALS)
    assert same(expand(folded, JOURNALS), normalize(specs, JOURNALS))


def test_fold_accepts_trees_and_generators() -> None:
    tree = yaml.safe_load(TUTORIAL)
    assert fold(tree, JOURNALS) == fold(iter(tutorial_specs()), JOURNALS)


def test_shard_trees() -> None:
    shards = [
        {
            "id": f"word-count/shard-00{i}",
            "sources": [{"journal": f"words/part-00{i}", "min_offset": 0}],
            "recovery_log_prefix": "recovery/logs",
            "hint_prefix": "/gazette/hints",
            "hint_backups": 2,
            "max_txn_duration": "1s",
            "hot_standbys": 1,
            "labels": [{"name": "app", "value": "word-count"}, {"name": f"shard-{i}"}],
            "revision": 10 + i,
        }
        for i in range(4)
    ]
    folded = fold(shards, SHARDS)
    assert list(folded) == [
        "id",
        "recovery_log_prefix",
        "hint_prefix",
        "hint_backups",
        "max_txn_duration",
        "hot_standbys",
        "labels",
        "children",
    ]
    assert folded["id"] == "word-count/"
    assert folded["labels"] == [{"name": "app", "value": "word-count"}]
    assert folded["children"][3] == {
        "id": "word-count/shard-003",
        "sources": [{"journal": "words/part-003", "min_offset": 0}],
        "labels": [{"name": "shard-3"}],
        "revision": 13,
    }
    flat = expand(folded, SHARDS)
    assert same(flat, normalize(shards, SHARDS))
    assert list(flat[0])[:2] == ["id", "sources"]
    assert size(folded, "id") < size(flat, "id")
    # A journal-style name key means nothing to shards: it is just an unknown field.
    assert error_of(expand, {"name": "x"}, SHARDS).field == "id"


# --- YAML ------------------------------------------------------------------------------


def test_yaml_round_trip_and_canonical_text() -> None:
    specs = load_yaml(TUTORIAL, JOURNALS)
    text = dump_yaml(fold(specs, JOURNALS), JOURNALS)
    assert same(load_yaml(text, JOURNALS), specs)
    assert text.splitlines()[:3] == ["name: foobar/", "replication: 1", "labels:"]
    assert text.rstrip().endswith("- name: foobar/part-002")
    assert dump_yaml(yaml.safe_load(TUTORIAL), JOURNALS) == text
    # Flat specs dump as a list, which loads back too; shared values never become aliases.
    flat_text = dump_yaml(specs, JOURNALS)
    assert "&" not in flat_text and "*" not in flat_text
    assert same(load_yaml(flat_text, JOURNALS), specs)


def test_yaml_multiple_documents() -> None:
    text = f"{TUTORIAL}---\n{yaml.safe_dump(EXAMPLE_JOURNAL)}---\n---\n- name: z/1\n- name: z/2\n"
    specs = load_yaml(text, JOURNALS)
    assert [s["name"] for s in specs] == [
        "example/journal",
        "foobar/part-000",
        "foobar/part-001",
        "foobar/part-002",
        "z/1",
        "z/2",
    ]
    folded = fold(specs, JOURNALS)
    assert same(load_yaml(dump_yaml(folded, JOURNALS), JOURNALS), specs)
    assert load_yaml("", JOURNALS) == []
    assert load_yaml("---\n...\n", JOURNALS) == []


def test_yaml_quirks_do_not_crash() -> None:
    # YAML 1.1 turns these into bools, ints and dates; field values are not checked here.
    text = "name: 'on'\nsuspend: yes\nflags: 017\nfragment: {retention: 1:30, x: 2001-12-14}"
    specs = load_yaml(text, JOURNALS)
    assert specs[0]["suspend"] is True
    assert specs[0]["fragment"]["retention"] == 90
    assert same(load_yaml(dump_yaml(specs, JOURNALS), JOURNALS), specs)
    err = error_of(load_yaml, "name: on\n", JOURNALS)
    assert (err.field, err.reason) == ("name", "expected a string, got bool")


# --- structural errors -----------------------------------------------------------------


def foobar(*children: object, **fields: object) -> dict[str, object]:
    return {"name": "foobar/", **fields, "children": list(children)}


@pytest.mark.parametrize(
    ("tree", "field", "reason"),
    [
        (
            foobar({"name": "foobar/a"}, {"name": "bar/x"}),
            "children[1].name",
            '"bar/x" is not under the group "foobar/"',
        ),
        (
            foobar({"name": "foobar/"}),
            "children[0].name",
            'leaf "foobar/" must not end in "/" (a group needs children)',
        ),
        (
            foobar({"name": "foobar/x/", "children": []}, {"name": "foobar/", "children": []}),
            "children[1].name",
            '"foobar/" is not under the group "foobar/"',
        ),
        (
            foobar({"name": "foobar/x/", "children": "foobar/x/1"}),
            "children[0].children",
            "expected a list of nodes, got str",
        ),
        (
            foobar({"name": "foobar/a"}, {"name": "foobar/b"}, 7),
            "children[2]",
            "expected a mapping, got int",
        ),
        (
            foobar({"name": "foobar/a"}, labels=[{"name": "x"}, {"value": "y"}]),
            "labels[1]",
            'expected a mapping with a string "name"',
        ),
        (
            foobar({"name": "foobar/a", "labels": ["x"]}),
            "children[0].labels[0]",
            'expected a mapping with a string "name"',
        ),
        (
            foobar({"name": "foobar/a", "labels": [{"name": "x", "value": 1}]}),
            "children[0].labels[0].value",
            "expected a string, got int",
        ),
        (
            foobar({"name": "foobar/a", "labels": [{"name": "x", "valeu": "1"}]}),
            "children[0].labels[0]",
            'unexpected key "valeu" (a label has "name", "value")',
        ),
        (
            foobar({"name": "foobar/a"}, labels={"x": "y"}),
            "labels",
            "expected a list of labels, got dict",
        ),
        (
            foobar({"name": "foobar/part-000"}, {"name": "foobar/part-000"}),
            "children[1].name",
            'duplicate leaf "foobar/part-000" (also at children[0])',
        ),
        (
            foobar({"name": "foobar/a"}, revision=3),
            "revision",
            'a group must not carry "revision", only leaves may',
        ),
        (
            {"name": "foobar", "children": [{"name": "foobar/a"}]},
            "name",
            'group "foobar" must end in "/" (only leaves have no "/" at the end)',
        ),
        (foobar({"replication": 1}), "children[0].name", "a leaf must have a non-empty name"),
        ({"name": ""}, "name", "a leaf must have a non-empty name"),
        (foobar({"name": 5}), "children[0].name", "expected a string, got int"),
        (foobar({"name": "foobar/a", 1: "x"}), "children[0]", "keys must be strings, got int"),
        (
            foobar({"name": "foobar/a", "fragment": {"stores": [{None: 1}]}}),
            "children[0].fragment.stores[0]",
            "keys must be strings, got null",
        ),
        ("foobar/", "", "expected a spec tree or a list of trees, got str"),
        ([{"name": "a"}, None], "[1]", "expected a mapping, got null"),
        (
            [{"name": "a"}, {"name": "a"}],
            "[1].name",
            'duplicate leaf "a" (also at [0])',
        ),
    ],
)
def test_structural_errors(tree: Any, field: str, reason: str) -> None:
    err = error_of(expand, tree, JOURNALS)
    assert (err.field, err.reason) == (field, reason)


def test_too_deep_trees_and_values() -> None:
    depth = MAX_DEPTH + 1
    tree: dict[str, Any] = {"name": "d/" * depth + "x"}
    for level in reversed(range(depth)):
        tree = {"name": "d/" * level, "children": [tree]}
    err = error_of(expand, tree, JOURNALS)
    assert err.reason == f"the tree is deeper than {MAX_DEPTH} levels"
    assert err.field == ".".join(["children[0]"] * (MAX_DEPTH + 1))

    value: Any = 1
    for _ in range(MAX_DEPTH + 5):
        value = [value]
    err = error_of(expand, {"name": "x", "flags": value}, JOURNALS)
    assert err.field.startswith("flags[0][0]")
    assert err.reason == f"nested deeper than {MAX_DEPTH} levels"
    self_ref: dict[str, Any] = {}
    self_ref["a"] = self_ref
    assert error_of(expand, {"name": "x", "fragment": self_ref}, JOURNALS).field.startswith(
        "fragment.a.a"
    )


def test_fold_and_normalize_errors() -> None:
    err = error_of(fold, [{"name": "a"}, {"name": "b"}, {"name": "a"}], JOURNALS)
    assert (err.field, err.reason) == ("[2].name", 'duplicate leaf "a" (also at [0])')
    assert error_of(fold, "abc", JOURNALS).field == ""
    assert error_of(fold, 5, JOURNALS).reason == "expected a list of specs, got int"
    assert error_of(normalize, [{"name": "a/"}], JOURNALS).field == "[0].name"


def test_yaml_errors() -> None:
    err = error_of(load_yaml, "name: a\n  bad: [\n", JOURNALS)
    assert err.field == "yaml"
    assert err.reason.startswith("line 2, column")
    err = error_of(load_yaml, "name: a\nfragment: {x: 2001-13-01}\n", JOURNALS)
    assert err.field == "yaml"
    err = error_of(load_yaml, "name: a\n---\n- name: b\n- name: a\n", JOURNALS)
    assert (err.field, err.reason) == (
        "document[1][1].name",
        'duplicate leaf "a" (also at document[0])',
    )
    err = error_of(load_yaml, "name: a\n---\n42\n", JOURNALS)
    assert (err.field, err.reason) == (
        "document[1]",
        "expected a spec tree or a list of trees, got int",
    )
    err = error_of(load_yaml, "? [a]\n: 1\n", JOURNALS)
    assert err.field == "yaml"
    err = error_of(load_yaml, "name: a\n1: 2\n", JOURNALS)
    assert (err.field, err.reason) == ("", "keys must be strings, got int")
    err = error_of(load_yaml, "[" * 600, JOURNALS)
    assert err.field == "yaml"
    assert error_of(load_yaml, b"name: a", JOURNALS).field == "yaml"
    assert error_of(dump_yaml, {"name": "a", "x": object()}, JOURNALS).field == ""


def test_alias_bombs_fail_fast() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    text = "name: bomb\nflags:\n  " + "\n  ".join(lines) + "\n"
    start = time.monotonic()
    err = error_of(load_yaml, text, JOURNALS)
    assert "too large" in err.reason
    # Expanded, the bomb is 10^9 nodes: minutes and gigabytes. Refused before that, it
    # takes well under a second; the bound is loose so a loaded CI machine stays green
    # (it failed at 3 s once, at 3.1 s, with the suite's Spark JVM alongside).
    assert time.monotonic() - start < 30


# --- properties ------------------------------------------------------------------------

NAMES = st.builds(
    lambda dirs, leaf: "/".join([*dirs, leaf]),
    st.lists(st.sampled_from(["a", "b", "", "ab"]), max_size=3),
    st.sampled_from(["x", "y", "z", "x.1"]),
)
LABELS = st.lists(
    st.sampled_from(
        [{"name": "l1"}, {"name": "l1", "value": "v"}, {"name": "l2", "value": "v"}, {"name": "l3"}]
    ),
    max_size=4,
)
FRAGMENT = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "length": st.sampled_from([1024, 2048]),
            "compression_codec": st.sampled_from(["GZIP", "SNAPPY"]),
            "stores": st.sampled_from([["s3://a/"], ["s3://a/", "s3://b/"], []]),
            "refresh_interval": st.sampled_from(["1m0s", None]),
            "extra": st.fixed_dictionaries({}, optional={"p": st.just(1), "q": st.just(2)}),
        },
    ),
    st.just("not-a-mapping"),
)
FIELDS = {
    "replication": st.sampled_from([1, 2, True, 1.0]),
    "labels": LABELS,
    "fragment": FRAGMENT,
    "suspend": st.sampled_from([{"level": "FULL"}, {"level": "NONE", "offset": 0}, None]),
    "max_append_rate": st.sampled_from([0, False, "0"]),
    "revision": st.integers(1, 3),
    "delete": st.just(True),
    "x-unknown": st.sampled_from([[1, 2], [1], "1"]),
}


@st.composite
def flat_specs(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(NAMES, unique=True, max_size=8))
    return [{"name": name, **draw(st.fixed_dictionaries({}, optional=FIELDS))} for name in names]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flat_specs())
def test_fold_invariants(specs: list[dict[str, Any]]) -> None:
    normal = normalize(specs, JOURNALS)
    folded = fold(specs, JOURNALS)
    assert same(expand(folded, JOURNALS), normal)
    assert same(fold(expand(folded, JOURNALS), JOURNALS), folded)
    assert size(folded, "name") <= size(normal, "name")
    assert same(canonicalize(folded, JOURNALS), folded)
    assert same(load_yaml(dump_yaml(folded, JOURNALS), JOURNALS), normal)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["name", "children", "labels", "revision", "fragment", "value"])
            | st.text(max_size=3)
            | st.integers(),
            inner,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_expand_and_fold_raise_only_validation_errors(data: Any) -> None:
    for fn in (expand, fold, normalize, canonicalize, dump_yaml):
        with contextlib.suppress(ValidationError):
            fn(data, JOURNALS)


NODE_TEXT = st.sampled_from(
    [
        "name: a/\n",
        "children:\n",
        "- name: a/b\n",
        "  - name: a/c\n",
        "labels: [{name: x}]\n",
        "fragment: {length: 1}\n",
        "revision: 3\n",
        "---\n",
        "  ",
        ": ",
        "&a ",
        "*a",
        "[",
        "{",
        "2001-13-01",
        "- ",
        "\t",
        '"',
        "? ",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | st.lists(NODE_TEXT, max_size=10).map("".join))
def test_load_yaml_raises_only_validation_errors(text: str) -> None:
    try:
        specs = load_yaml(text, JOURNALS)
    except ValidationError:
        return
    assert same(load_yaml(dump_yaml(specs, JOURNALS), JOURNALS), specs)
