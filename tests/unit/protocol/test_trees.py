"""YAML spec trees to validated SpecChanges, and specs back to YAML trees."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gazette.errors import ValidationError
from gazette.labels import LabelSet
from gazette.local.tutorial import FOOBAR_TREE_YAML
from gazette.protocol import (
    CompressionCodec,
    FragmentSpec,
    JournalFlags,
    JournalSpec,
    ShardSource,
    ShardSpec,
    Suspend,
    SuspendLevel,
)
from gazette.protocol.trees import (
    SpecChange,
    journal_changes_from_yaml,
    shard_changes_from_yaml,
    specs_to_yaml,
)

FOOBAR = FOOBAR_TREE_YAML

EXAMPLE_LISTING = """\
name: example/journal
replication: 1
labels:
- name: app.gazette.dev/message-type
  value: TestMessage
fragment:
  length: 131073
  compression_codec: GZIP
  stores:
  - file:///
  refresh_interval: 1m0s
  retention: 1h0m0s
  flush_interval: 1m0s
revision: 3
"""

SHARDS = """\
id: word-count/
sources:
- journal: examples/word-count/deltas
recovery_log_prefix: examples/word-count/recovery-logs
hint_prefix: /gazette/hints
max_txn_duration: 1s
children:
- id: word-count/part-000
- id: word-count/part-001
  hot_standbys: 1
  revision: 12
"""


def tree_error(text: str, shards: bool = False) -> ValidationError:
    load = shard_changes_from_yaml if shards else journal_changes_from_yaml
    with pytest.raises(ValidationError) as info:
        load(text)
    assert info.value.reason
    return info.value


def assert_tree_error(text: str, field: str, phrase: str, shards: bool = False) -> None:
    err = tree_error(text, shards)
    assert err.field == field, str(err)
    assert phrase in err.reason, str(err)


# --- valid trees ------------------------------------------------------------------------


def test_tutorial_tree_expands_to_its_children() -> None:
    changes = journal_changes_from_yaml(FOOBAR)
    assert [c.name for c in changes] == ["foobar/part-000", "foobar/part-001", "foobar/part-002"]
    expected_fragment = FragmentSpec(
        length=4096,
        compression_codec=CompressionCodec.GZIP,
        stores=("file:///",),
        refresh_interval=timedelta(minutes=1),
        flush_interval=timedelta(minutes=1),
    )
    labels = LabelSet([("content-type", "application/x-ndjson"), ("my-label", "")])
    for change in changes:
        assert change.revision == 0 and not change.is_delete
        assert change.spec == JournalSpec(change.name, replication=1, labels=labels,
                                          fragment=expected_fragment)


def test_tutorial_listing_keeps_its_revision() -> None:
    [change] = journal_changes_from_yaml(EXAMPLE_LISTING)
    assert change.name == "example/journal"
    assert change.revision == 3
    assert change.spec is not None
    assert change.spec.fragment.length == 131073
    assert change.spec.fragment.retention == timedelta(hours=1)


def test_children_override_and_labels_unite() -> None:
    text = FOOBAR.replace(
        "  - name: foobar/part-001\n",
        "  - name: foobar/part-001\n    replication: 2\n    fragment: {length: 8192}\n"
        "    labels: [{name: extra, value: x}]\n    revision: 5\n",
    )
    changes = {c.name: c for c in journal_changes_from_yaml(text)}
    one = changes["foobar/part-001"]
    assert one.revision == 5
    assert one.spec is not None
    assert one.spec.replication == 2
    assert one.spec.fragment.length == 8192
    assert one.spec.fragment.compression_codec is CompressionCodec.GZIP  # inherited
    assert one.spec.labels.value_of("extra") == "x"
    assert one.spec.labels.value_of("content-type") == "application/x-ndjson"
    other = changes["foobar/part-000"].spec
    assert other is not None and other.replication == 1 and "extra" not in other.labels


def test_several_documents_and_lists_of_trees() -> None:
    text = FOOBAR + "---\n" + EXAMPLE_LISTING + "---\n- name: x/a\n- name: x/b\n"
    names = [c.name for c in journal_changes_from_yaml(text)]
    assert sorted(names) == sorted(
        ["foobar/part-000", "foobar/part-001", "foobar/part-002", "example/journal", "x/a",
         "x/b"])


def test_empty_text_is_no_changes() -> None:
    assert journal_changes_from_yaml("") == []
    assert journal_changes_from_yaml("---\n...\n") == []


def test_shard_tree() -> None:
    changes = shard_changes_from_yaml(SHARDS)
    assert [(c.name, c.revision) for c in changes] == [
        ("word-count/part-000", 0), ("word-count/part-001", 12)]
    spec = changes[1].spec
    assert spec is not None
    assert spec.sources == (ShardSource("examples/word-count/deltas"),)
    assert spec.recovery_log == "examples/word-count/recovery-logs/word-count/part-001"
    assert spec.hot_standbys == 1


# --- deletes --------------------------------------------------------------------------


def test_delete_produces_a_delete_change() -> None:
    [change] = journal_changes_from_yaml("name: a/b\ndelete: true\nrevision: 7\n")
    assert change == SpecChange("a/b", 7, None)
    assert change.is_delete


def test_delete_false_is_an_upsert() -> None:
    [change] = journal_changes_from_yaml("name: a/b\ndelete: false\n")
    assert change.spec == JournalSpec("a/b")


def test_delete_ignores_other_fields() -> None:
    """A delete needs only the name (and revision): the rest is not validated."""
    [change] = journal_changes_from_yaml("name: a/b\ndelete: true\nreplication: 0\n")
    assert change.is_delete


def test_delete_on_a_group_deletes_every_child() -> None:
    changes = journal_changes_from_yaml(
        "name: a/\ndelete: true\nchildren:\n"
        "- {name: a/b, revision: 1}\n- {name: a/c, revision: 2}\n")
    assert changes == [SpecChange("a/b", 1, None), SpecChange("a/c", 2, None)]


def test_shard_delete() -> None:
    [change] = shard_changes_from_yaml("id: s/1\ndelete: true\nrevision: 4\n")
    assert change == SpecChange[ShardSpec]("s/1", 4, None)


def test_spec_change_can_be_built_through_its_generic_alias() -> None:
    change = SpecChange[JournalSpec]("a/b", 3, None)
    assert change.is_delete and change == SpecChange("a/b", 3, None)


def test_delete_without_name() -> None:
    assert_tree_error("delete: true\n", "name", "non-empty name")
    assert_tree_error("name: a/\nchildren:\n- delete: true\n", "children[0].name",
                      "non-empty name")
    assert_tree_error("delete: true\n", "id", "non-empty name", shards=True)


@pytest.mark.parametrize("value", ["'yes'", "1", "[true]", "{a: 1}"])
def test_bad_delete(value: str) -> None:
    assert_tree_error(f"name: a/b\ndelete: {value}\n", "a/b: delete", "expected true or false")


def test_empty_mapping_delete_means_unset() -> None:
    """Trees drop empty mappings as "not set", so ``delete: {}`` is an upsert."""
    [change] = journal_changes_from_yaml("name: a/b\ndelete: {}\n")
    assert not change.is_delete


# --- errors are prefixed with the leaf's name -------------------------------------------


def test_bad_field_in_a_child_leaf() -> None:
    text = FOOBAR.replace("  - name: foobar/part-001\n",
                          "  - name: foobar/part-001\n    fragment:\n      length: 1\n")
    assert_tree_error(text, "foobar/part-001: fragment.length", "at least 1024 bytes")


def test_bad_inherited_field_names_the_first_leaf() -> None:
    text = FOOBAR.replace("length: 4096", "length: 10")
    assert_tree_error(text, "foobar/part-000: fragment.length", "at least 1024")


@pytest.mark.parametrize(
    ("snippet", "field", "phrase"),
    [
        ("replicaton: 2", "a/b: replicaton", "unknown field"),
        ("replication: 0", "a/b: replication", "at least 1"),
        ("labels: [{name: name, value: a/b}]", "a/b: labels.name", "implicit"),
        ("labels: [{name: 'x y'}]", "a/b: labels[0].name", "invalid character"),
        ("fragment: {stores: ['file:///', 'gs://x/']}", "a/b: fragment.stores[1]", "scheme"),
        ("fragment: {flush_interval: 500ms}", "a/b: fragment.flush_interval", "at least 1s"),
        ("fragment: {retention: 2020-01-01}", "a/b: fragment.retention", "got date"),
        ("fragment: {stores: [!!binary aGVsbG8=]}", "a/b: fragment.stores[0]", "got bytes"),
        ("flags: [O_RDONLY, O_WRONLY]", "a/b: flags", "together"),
        ("suspend: {level: HALF}", "a/b: suspend.level", "unknown level"),
        ("revision: -1", "a/b: revision", "at least 0"),
        ("revision: '3'", "a/b: revision", "expected an integer"),
        ("revision: 1.0", "a/b: revision", "expected an integer"),
        ("revision: true", "a/b: revision", "expected an integer"),
    ],
)
def test_leaf_errors(snippet: str, field: str, phrase: str) -> None:
    assert_tree_error(f"name: a/b\n{snippet}\n", field, phrase)


@pytest.mark.parametrize(
    ("name", "phrase"),
    [("a//b", "'//'"), ("a=b", "invalid character '='"), ("a", "shorter than 2")],
)
def test_bad_leaf_names(name: str, phrase: str) -> None:
    assert_tree_error(f"name: '{name}'\n", f"{name}: name", phrase)


def test_shard_leaf_errors() -> None:
    text = SHARDS.replace("  hot_standbys: 1\n", "  hot_standbys: 99\n")
    assert_tree_error(text, "word-count/part-001: hot_standbys", "at most 32", shards=True)
    text = SHARDS.replace("hint_prefix: /gazette/hints\n", "")
    assert_tree_error(text, "word-count/part-000: hint_prefix", "is required", shards=True)
    assert_tree_error("id: s/1\nsources: [{journal: a/b}, {journal: a/b}]\n",
                      "s/1: sources[1].journal", "already sources[0]", shards=True)


@pytest.mark.parametrize(
    ("text", "field", "phrase"),
    [
        ("name: [a\n", "yaml", "line 2"),
        ("name: a/b\n  bad indent: x\n", "yaml", "line"),
        ("name: !!python/object:os.system a\n", "yaml", "constructor"),
        ("hello\n", "", "expected a spec tree"),
        ("name: a/\nrevision: 3\nchildren:\n- name: a/b\n", "revision", "only leaves"),
        ("name: a/\nchildren:\n- name: b/c\n", "children[0].name", "not under the group"),
        ("name: a/b\n---\nname: a/b\n", "document[1].name", "duplicate leaf"),
        ("name: 12\n", "name", "expected a string"),
        ("name: a/b/\n", "name", "must not end in"),
    ],
)
def test_structure_errors(text: str, field: str, phrase: str) -> None:
    assert_tree_error(text, field, phrase)


def test_text_must_be_text() -> None:
    with pytest.raises(ValidationError) as info:
        journal_changes_from_yaml(b"name: a/b\n")  # type: ignore[arg-type]
    assert info.value.field == "yaml"


# --- round trips through YAML ------------------------------------------------------------

JOURNALS = [
    JournalSpec(
        f"foobar/part-00{i}",
        replication=1,
        labels=LabelSet([("content-type", "application/x-ndjson"), ("part", str(i))]),
        fragment=FragmentSpec(length=4096, compression_codec=CompressionCodec.GZIP,
                              stores=("file:///",), refresh_interval=timedelta(minutes=1),
                              flush_interval=timedelta(minutes=1)),
    )
    for i in range(3)
] + [
    JournalSpec("example/journal", flags=JournalFlags.O_RDONLY,
                suspend=Suspend(SuspendLevel.PARTIAL, 10), max_append_rate=100,
                fragment=FragmentSpec(path_postfix_template="date={date}/hour={hour}")),
]


def test_journal_specs_round_trip_through_yaml() -> None:
    pairs = [(spec, rev) for spec, rev in zip(JOURNALS, [7, 0, 9, 11], strict=True)]
    text = specs_to_yaml(pairs)
    back = journal_changes_from_yaml(text)
    assert sorted((c.name, c.revision, c.spec) for c in back if c.spec) == sorted(
        ((s.name, rev, s) for s, rev in pairs), key=lambda t: t[0])
    # Shared fields are stated once, on the group.
    assert text.count("compression_codec: GZIP") == 1


def test_shard_specs_round_trip_through_yaml() -> None:
    specs = [
        ShardSpec(f"word-count/part-00{i}", (ShardSource("a/b", i),),
                  recovery_log_prefix="logs", hint_prefix="/hints", hint_backups=i)
        for i in range(3)
    ]
    pairs = [(s, i * 10) for i, s in enumerate(specs)]
    back = shard_changes_from_yaml(specs_to_yaml(pairs))
    assert [(c.name, c.revision, c.spec) for c in back] == [
        (s.id, rev, s) for s, rev in pairs]


def test_no_specs_is_empty_yaml() -> None:
    assert specs_to_yaml([]) == ""
