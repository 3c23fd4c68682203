"""ShardSpec and ShardSource: a full spec, defaults, and every rule's error path."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml

from gazette.errors import ValidationError
from gazette.labels import LabelSet
from gazette.protocol.fields import INT64_MAX
from gazette.protocol.shard_spec import (
    DEFAULT_MAX_TXN_DURATION,
    DEFAULT_READ_CHANNEL_SIZE,
    DEFAULT_RING_BUFFER_SIZE,
    MAX_HINT_BACKUPS,
    MAX_HOT_STANDBYS,
    MAX_SOURCES,
    ShardSource,
    ShardSpec,
)

SHARD_YAML = """\
id: word-count/part-000
sources:
- journal: examples/word-count/deltas/part-000
  min_offset: 1024
- journal: examples/word-count/deltas/part-001
recovery_log_prefix: examples/word-count/recovery-logs
hint_prefix: /gazette/hints
hint_backups: 2
max_txn_duration: 1s
min_txn_duration: 10ms
hot_standbys: 1
labels:
- name: app.gazette.dev/managed-by
  value: word-count
"""


def shard() -> dict[str, Any]:
    data = yaml.safe_load(SHARD_YAML)
    assert isinstance(data, dict)
    return data


def minimal(**changes: Any) -> dict[str, Any]:
    """The smallest valid shard, with `changes`."""
    return {"id": "s-1", "sources": [{"journal": "a/b"}], **changes}


def assert_shard_error(data: object, field: str, phrase: str) -> None:
    with pytest.raises(ValidationError) as info:
        ShardSpec.from_dict(data)
    assert info.value.field == field, str(info.value)
    assert phrase in info.value.reason, str(info.value)


# --- a full spec ----------------------------------------------------------------------


def test_full_spec_parses() -> None:
    spec = ShardSpec.from_dict(shard())
    assert spec.id == "word-count/part-000"
    assert spec.sources == (
        ShardSource("examples/word-count/deltas/part-000", 1024),
        ShardSource("examples/word-count/deltas/part-001"),
    )
    assert spec.recovery_log == "examples/word-count/recovery-logs/word-count/part-000"
    assert spec.hint_keys == (
        "/gazette/hints/word-count/part-000.primary",
        "/gazette/hints/word-count/part-000.backup.1",
        "/gazette/hints/word-count/part-000.backup.2",
    )
    assert spec.max_txn_duration == timedelta(seconds=1)
    assert spec.min_txn_duration == timedelta(milliseconds=10)
    assert spec.hot_standbys == 1
    assert spec.labels.value_of("app.gazette.dev/managed-by") == "word-count"


def test_full_spec_round_trips() -> None:
    spec = ShardSpec.from_dict(shard())
    assert ShardSpec.from_dict(spec.to_dict()) == spec
    assert ShardSpec.from_dict(yaml.safe_load(yaml.safe_dump(spec.to_dict()))) == spec


def test_to_dict_is_canonical() -> None:
    spec = ShardSpec.from_dict(minimal(disable=True, disable_wait_for_ack=True))
    assert spec.to_dict() == {
        "id": "s-1",
        "sources": [{"journal": "a/b"}],
        "max_txn_duration": "1s",
        "min_txn_duration": "0s",
        "disable": True,
        "hot_standbys": 0,
        "disable_wait_for_ack": True,
        "ring_buffer_size": 8192,
        "read_channel_size": 4096,
    }


def test_defaults_for_missing_fields() -> None:
    spec = ShardSpec.from_dict(minimal())
    assert spec == ShardSpec("s-1", (ShardSource("a/b"),))
    assert spec.sources[0].min_offset == 0
    assert spec.recovery_log_prefix == "" and spec.recovery_log is None
    assert spec.hint_prefix == "" and spec.hint_keys == ()
    assert spec.hint_backups == 0
    assert spec.max_txn_duration == DEFAULT_MAX_TXN_DURATION == timedelta(seconds=1)
    assert spec.min_txn_duration == timedelta(0)
    assert spec.disable is False and spec.disable_wait_for_ack is False
    assert spec.hot_standbys == 0
    assert spec.labels == LabelSet()
    assert spec.ring_buffer_size == DEFAULT_RING_BUFFER_SIZE == 8192
    assert spec.read_channel_size == DEFAULT_READ_CHANNEL_SIZE == 4096


def test_recovery_log_without_backups() -> None:
    spec = ShardSpec.from_dict(minimal(recovery_log_prefix="logs", hint_prefix="/hints"))
    assert spec.recovery_log == "logs/s-1"
    assert spec.hint_keys == ("/hints/s-1.primary",)


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("data", [None, [], "id: s", 7])
def test_non_mapping_input(data: object) -> None:
    assert_shard_error(data, "", "expected a mapping")


def test_unknown_fields_are_named() -> None:
    assert_shard_error(minimal(hot_standby=1), "hot_standby", "unknown field")
    assert_shard_error(minimal(sources=[{"journal": "a/b", "offset": 1}]),
                       "sources[0].offset", "unknown field")


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        (None, "is required"),
        ("", "must not be empty"),
        ("a//b", "'//'"),
        ("/a", "must not begin with '/'"),
        ("a/", "must not end with '/'"),
        ("a/../b", "'..'"),
        ("a=b", "invalid character '='"),
        ("x" * 513, "longer than 512"),
        (5, "expected a string"),
    ],
)
def test_bad_ids(value: object, phrase: str) -> None:
    assert_shard_error(minimal(id=value), "id", phrase)


@pytest.mark.parametrize(
    ("sources", "field", "phrase"),
    [
        ([], "sources", "at least one source"),
        (None, "sources", "at least one source"),
        ("a/b", "sources", "expected a list"),
        ({"journal": "a/b"}, "sources", "expected a list"),
        ([{"journal": "a/b"}, "c/d"], "sources[1]", "expected a mapping"),
        ([{"journal": "a/b"}, {}], "sources[1].journal", "is required"),
        ([{"journal": "a/b"}, {"journal": "c//d"}], "sources[1].journal", "'//'"),
        ([{"journal": "a/b"}, {"journal": "a/b"}], "sources[1].journal",
         "already sources[0]"),
        ([{"journal": "a/b", "min_offset": -1}], "sources[0].min_offset", "at least 0"),
        ([{"journal": "a/b", "min_offset": INT64_MAX + 1}], "sources[0].min_offset", "at most"),
        ([{"journal": "a/b", "min_offset": "0"}], "sources[0].min_offset",
         "expected an integer"),
        ([{"journal": f"j/{i}"} for i in range(MAX_SOURCES + 1)], "sources", "at most 1024"),
    ],
)
def test_bad_sources(sources: object, field: str, phrase: str) -> None:
    assert_shard_error(minimal(sources=sources), field, phrase)


@pytest.mark.parametrize(
    ("changes", "field", "phrase"),
    [
        ({"recovery_log_prefix": "logs"}, "hint_prefix", "is required with a recovery_log"),
        ({"hint_prefix": "/hints"}, "hint_prefix", "only applies with a recovery_log_prefix"),
        ({"hint_backups": 1}, "hint_backups", "only applies with a recovery_log_prefix"),
        ({"recovery_log_prefix": "/logs", "hint_prefix": "/h"}, "recovery_log_prefix",
         "must not begin with '/'"),
        ({"recovery_log_prefix": "logs/", "hint_prefix": "/h"}, "recovery_log_prefix",
         "must not end with '/'"),
        ({"recovery_log_prefix": 3, "hint_prefix": "/h"}, "recovery_log_prefix",
         "expected a string"),
        ({"recovery_log_prefix": "logs", "hint_prefix": "hints"}, "hint_prefix",
         "must begin with '/'"),
        ({"recovery_log_prefix": "logs", "hint_prefix": "/hints/"}, "hint_prefix",
         "must not end with '/'"),
        ({"recovery_log_prefix": "logs", "hint_prefix": "/h", "hint_backups": -1},
         "hint_backups", "at least 0"),
        ({"recovery_log_prefix": "logs", "hint_prefix": "/h",
          "hint_backups": MAX_HINT_BACKUPS + 1}, "hint_backups", "at most 16"),
        ({"id": "x" * 500, "recovery_log_prefix": "y" * 12, "hint_prefix": "/h"},
         "recovery_log_prefix", "would be 513 characters, longer than a journal name"),
    ],
)
def test_bad_recovery_log_and_hints(changes: dict[str, Any], field: str, phrase: str) -> None:
    assert_shard_error(minimal(**changes), field, phrase)


@pytest.mark.parametrize("key", ["max_txn_duration", "min_txn_duration"])
@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ("-1s", "must not be negative"),
        ("later", "is not a duration"),
        (False, "expected a duration"),
        ("1000000h", "longer than 100 years"),
        (float("nan"), "finite"),
    ],
)
def test_bad_txn_durations(key: str, value: object, phrase: str) -> None:
    assert_shard_error(minimal(**{key: value}), key, phrase)


@pytest.mark.parametrize(
    ("changes", "field", "phrase"),
    [
        ({"max_txn_duration": "0s"}, "max_txn_duration", "at least 1ms"),
        ({"max_txn_duration": "1h0m1s"}, "max_txn_duration", "at most 1h0m0s"),
        ({"min_txn_duration": "2s"}, "min_txn_duration", "exceeds max_txn_duration 1s"),
        ({"min_txn_duration": "5s", "max_txn_duration": "4s"}, "min_txn_duration", "exceeds"),
    ],
)
def test_txn_duration_bounds(changes: dict[str, Any], field: str, phrase: str) -> None:
    assert_shard_error(minimal(**changes), field, phrase)


def test_txn_duration_edges_ok() -> None:
    spec = ShardSpec.from_dict(minimal(max_txn_duration="1ms", min_txn_duration="1ms"))
    assert spec.max_txn_duration == spec.min_txn_duration == timedelta(milliseconds=1)
    assert ShardSpec.from_dict(minimal(max_txn_duration="1h")).max_txn_duration == timedelta(
        hours=1)


@pytest.mark.parametrize(
    ("key", "value", "phrase"),
    [
        ("hot_standbys", -1, "at least 0"),
        ("hot_standbys", MAX_HOT_STANDBYS + 1, "at most 32"),
        ("hot_standbys", "1", "expected an integer"),
        ("ring_buffer_size", 0, "at least 1"),
        ("ring_buffer_size", (1 << 24) + 1, "at most 16777216"),
        ("read_channel_size", 0, "at least 1"),
        ("read_channel_size", (1 << 24) + 1, "at most"),
        ("disable", "yes", "expected true or false"),
        ("disable", 1, "expected true or false"),
        ("disable_wait_for_ack", "no", "expected true or false"),
        ("revision", -1, "at least 0"),
    ],
)
def test_bad_scalars(key: str, value: object, phrase: str) -> None:
    assert_shard_error(minimal(**{key: value}), key, phrase)


def test_hot_standby_bounds_ok() -> None:
    assert ShardSpec.from_dict(minimal(hot_standbys=MAX_HOT_STANDBYS)).hot_standbys == 32


@pytest.mark.parametrize(
    ("labels", "field", "phrase"),
    [
        ([{"name": "id", "value": "s-1"}], "labels.id", "implicit"),
        ([{"name": "prefix", "value": "s/"}], "labels.prefix", "implicit"),
        ([{"name": "bad name"}], "labels[0].name", "invalid character"),
        ("app=x", "labels", "expected a list"),
    ],
)
def test_bad_labels(labels: object, field: str, phrase: str) -> None:
    assert_shard_error(minimal(labels=labels), field, phrase)


def test_journal_reserved_name_label_is_fine_on_shards() -> None:
    spec = ShardSpec.from_dict(minimal(labels=[{"name": "name", "value": "x"}]))
    assert spec.labels.value_of("name") == "x"


def test_errors_nest_under_a_given_field() -> None:
    with pytest.raises(ValidationError) as info:
        ShardSpec.from_dict(minimal(sources=[{"journal": "a/b"}, {"journal": "a/b"}]),
                            "shards[2]")
    assert info.value.field == "shards[2].sources[1].journal"


# --- direct construction --------------------------------------------------------------

# Untyped callers may pass anything: these aliases let the tests do so too.
_ShardSpec: Any = ShardSpec
_ShardSource: Any = ShardSource


@pytest.mark.parametrize(
    ("make", "field", "phrase"),
    [
        (lambda: _ShardSpec("s", ()), "sources", "at least one"),
        (lambda: _ShardSpec("s", ({"journal": "a/b"},)), "sources[0]",
         "expected a ShardSource"),
        (lambda: _ShardSpec("s", (_ShardSource("a/b"), _ShardSource("a/b", 5))),
         "sources[1].journal", "already sources[0]"),
        (lambda: _ShardSource("a//b"), "journal", "'//'"),
        (lambda: _ShardSource("a/b", -1), "min_offset", "at least 0"),
        (lambda: _ShardSource("a/b", 1.5), "min_offset", "expected an integer"),
        (lambda: _ShardSpec("s", (_ShardSource("a/b"),), disable=1), "disable",
         "expected true or false"),
        (lambda: _ShardSpec("s", (_ShardSource("a/b"),), max_txn_duration=1), "max_txn_duration",
         "expected a duration"),
        (lambda: _ShardSpec("s", (_ShardSource("a/b"),), hot_standbys=True), "hot_standbys",
         "expected an integer"),
    ],
)
def test_direct_construction_is_validated(make: Any, field: str, phrase: str) -> None:
    with pytest.raises(ValidationError) as info:
        make()
    assert info.value.field == field, str(info.value)
    assert phrase in info.value.reason, str(info.value)


def test_source_from_dict_field_paths() -> None:
    with pytest.raises(ValidationError) as info:
        ShardSource.from_dict({"journal": "x"}, "sources[4]")
    assert info.value.field == "sources[4].journal"
    assert ShardSource.from_dict({"journal": "a/b", "min_offset": 7}, "s") == ShardSource(
        "a/b", 7)
