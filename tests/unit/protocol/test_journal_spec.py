"""JournalSpec and its parts: the tutorial's specs, defaults, and every rule's error path."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml

from gazette.errors import ValidationError
from gazette.labels import LabelSet
from gazette.local.tutorial import EXAMPLE_JOURNAL_YAML
from gazette.protocol.fields import INT64_MAX
from gazette.protocol.journal_spec import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_FRAGMENT_LENGTH,
    DEFAULT_REFRESH_INTERVAL,
    DEFAULT_REPLICATION,
    CompressionCodec,
    FragmentSpec,
    GiB,
    JournalFlags,
    JournalSpec,
    KiB,
    MiB,
    Suspend,
    SuspendLevel,
    validate_store_url,
)

TUTORIAL_YAML = EXAMPLE_JOURNAL_YAML


def tutorial() -> dict[str, Any]:
    data = yaml.safe_load(TUTORIAL_YAML)
    assert isinstance(data, dict)
    return data


def with_fields(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`base` with top-level keys replaced; a key `fragment__x` sets ``fragment.x``."""
    out = {**base, "fragment": dict(base.get("fragment", {}))}
    for key, value in changes.items():
        if key.startswith("fragment__"):
            out["fragment"][key.removeprefix("fragment__")] = value
        else:
            out[key] = value
    return out


def journal_error(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        JournalSpec.from_dict(data)
    assert info.value.reason
    return info.value


def assert_journal_error(data: object, field: str, phrase: str) -> None:
    err = journal_error(data)
    assert err.field == field, str(err)
    assert phrase in err.reason, str(err)


# --- the tutorial -----------------------------------------------------------------------


def test_tutorial_spec_parses() -> None:
    spec = JournalSpec.from_dict(tutorial())
    assert spec.name == "example/journal"
    assert spec.replication == 1
    assert spec.labels.value_of("app.gazette.dev/message-type") == "TestMessage"
    assert spec.labels.value_of("content-type") == "application/x-ndjson"
    assert len(spec.labels) == 4
    assert spec.fragment.length == 131072
    assert spec.fragment.compression_codec is CompressionCodec.SNAPPY
    assert spec.fragment.stores == ("file:///",)
    assert spec.fragment.refresh_interval == timedelta(minutes=1)
    # Not given, so defaulted.
    assert spec.fragment.retention == timedelta(0)
    assert spec.fragment.flush_interval == DEFAULT_FLUSH_INTERVAL
    assert spec.flags is JournalFlags.NOT_SPECIFIED
    assert spec.suspend is None


def test_tutorial_listing_with_revision_parses() -> None:
    """``gazctl journals list --format yaml`` output carries a revision; from_dict takes it."""
    data = with_fields(tutorial(), revision=3, fragment__retention="1h0m0s",
                       fragment__flush_interval="1m0s")
    spec = JournalSpec.from_dict(data)
    assert spec.fragment.retention == timedelta(hours=1)
    assert spec.fragment.flush_interval == timedelta(minutes=1)


def test_tutorial_spec_round_trips_through_dict() -> None:
    spec = JournalSpec.from_dict(tutorial())
    assert JournalSpec.from_dict(spec.to_dict()) == spec
    # And through YAML text, as gazctl would write and read it.
    assert JournalSpec.from_dict(yaml.safe_load(yaml.safe_dump(spec.to_dict()))) == spec


def test_to_dict_is_canonical() -> None:
    spec = JournalSpec.from_dict(with_fields(tutorial(), fragment__compression_codec="gzip"))
    assert spec.to_dict() == {
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
            "compression_codec": "GZIP",
            "stores": ["file:///"],
            "refresh_interval": "1m0s",
            "retention": "0s",
            "flush_interval": "10m0s",
        },
    }


def test_to_dict_writes_optional_fields_only_when_set() -> None:
    spec = JournalSpec(
        "a/b",
        labels=LabelSet([("my-label", "")]),
        fragment=FragmentSpec(path_postfix_template="date={date}"),
        flags=JournalFlags.O_RDONLY,
        max_append_rate=1000,
        suspend=Suspend(SuspendLevel.PARTIAL, 42),
    )
    d = spec.to_dict()
    assert d["labels"] == [{"name": "my-label"}]
    assert d["flags"] == "O_RDONLY"
    assert d["max_append_rate"] == 1000
    assert d["suspend"] == {"level": "PARTIAL", "offset": 42}
    assert d["fragment"]["path_postfix_template"] == "date={date}"
    assert JournalSpec.from_dict(d) == spec


# --- defaults ---------------------------------------------------------------------------


def test_defaults_for_missing_fields() -> None:
    spec = JournalSpec.from_dict({"name": "a/b"})
    assert spec == JournalSpec("a/b")
    assert spec.replication == DEFAULT_REPLICATION == 3
    assert spec.labels == LabelSet()
    assert spec.flags is JournalFlags.NOT_SPECIFIED
    assert spec.max_append_rate == 0  # no limit
    assert spec.suspend is None
    f = spec.fragment
    assert f.length == DEFAULT_FRAGMENT_LENGTH == 512 * MiB
    assert f.compression_codec is CompressionCodec.SNAPPY
    assert f.stores == ()
    assert f.refresh_interval == DEFAULT_REFRESH_INTERVAL == timedelta(minutes=5)
    assert f.retention == timedelta(0)  # keep forever
    assert f.flush_interval == DEFAULT_FLUSH_INTERVAL == timedelta(minutes=10)
    assert f.path_postfix_template == ""


def test_null_fields_count_as_missing() -> None:
    spec = JournalSpec.from_dict(
        {"name": "a/b", "replication": None, "labels": None, "fragment": None, "flags": None,
         "suspend": None, "revision": None}
    )
    assert spec == JournalSpec("a/b")
    assert FragmentSpec.from_dict({"length": None, "stores": None}) == FragmentSpec()


def test_partial_fragment_keeps_other_defaults() -> None:
    spec = JournalSpec.from_dict({"name": "a/b", "fragment": {"length": 4096}})
    assert spec.fragment == FragmentSpec(length=4096)


# --- top-level errors -------------------------------------------------------------------


@pytest.mark.parametrize("data", [None, [], "name: a/b", 3, 1.5, True, ["name", "a/b"]])
def test_non_mapping_input(data: object) -> None:
    assert_journal_error(data, "", "expected a mapping")


def test_non_mapping_input_at_a_nested_field() -> None:
    with pytest.raises(ValidationError) as info:
        JournalSpec.from_dict([1], "journals[3]")
    assert info.value.field == "journals[3]"


def test_non_string_keys() -> None:
    assert_journal_error({"name": "a/b", 1: 2}, "", "keys must be strings")


def test_unknown_field_is_named() -> None:
    assert_journal_error({"name": "a/b", "replicaton": 3}, "replicaton", "unknown field")
    err = journal_error({"name": "a/b", "replicaton": 3})
    assert "replication" in err.reason  # lists the known fields
    assert_journal_error({"name": "a/b", "fragment": {"lenght": 4096}},
                         "fragment.lenght", "unknown field")
    assert_journal_error({"name": "a/b", "suspend": {"levl": "FULL"}},
                         "suspend.levl", "unknown field")
    assert_journal_error({"name": "a/b", "labels": [{"name": "a", "valu": "b"}]},
                         "labels[0].valu", "unknown field")
    # An empty key is still named visibly.
    assert_journal_error({"name": "a/b", "": 1}, '""', "unknown field")
    assert_journal_error({"name": "a/b", "fragment": {"": 1}}, 'fragment.""', "unknown field")


@pytest.mark.parametrize(
    ("name", "phrase"),
    [
        (None, "is required"),
        ("", "shorter than 2"),
        ("a", "shorter than 2"),
        ("x" * 513, "longer than 512"),
        ("a//b", "'//'"),
        ("a/../b", "'..'"),
        ("/a/b", "must not begin with '/'"),
        ("a/b/", "must not end with '/'"),
        ("date=1/x", "invalid character '='"),
        (12, "expected a string"),
        (["a/b"], "expected a string"),
    ],
)
def test_bad_names(name: object, phrase: str) -> None:
    assert_journal_error({"name": name}, "name", phrase)


def test_missing_name() -> None:
    assert_journal_error({"replication": 1}, "name", "is required")


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        (0, "at least 1"),
        (-1, "at least 1"),
        (1025, "at most 1024"),
        (True, "expected an integer"),
        ("3", "expected an integer"),
        (3.0, "expected an integer"),
        ([3], "expected an integer"),
    ],
)
def test_bad_replication(value: object, phrase: str) -> None:
    assert_journal_error({"name": "a/b", "replication": value}, "replication", phrase)


def test_monstrous_values_give_short_errors() -> None:
    """Values no JSON or YAML parser would produce still give a ValidationError, whose
    message stays short."""
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    for value, phrase in [
        (10**5000, "at most 1024, got <16610-bit integer>"),
        (deep, "expected an integer, got list [[[[...]]]]"),
        (list(range(10**6)), "expected an integer, got list [0, 1"),
        ("x" * 10**6, "expected an integer, got str 'xxx"),
    ]:
        err = journal_error({"name": "a/b", "replication": value})
        assert err.field == "replication" and phrase in err.reason, err.reason
        assert len(err.reason) < 300
    err = journal_error({"name": "a/b", "flags": 10**5000})
    assert err.field == "flags" and "-bit integer" in err.reason
    err = journal_error({"name": "a/b", "fragment": {"stores": ["gs://" + "x" * 10**6]}})
    assert err.field == "fragment.stores[0]" and len(err.reason) < 400


@pytest.mark.parametrize(
    ("value", "phrase"),
    [(-1, "at least 0"), (INT64_MAX + 1, "at most"), ("1MB", "expected an integer")],
)
def test_bad_max_append_rate(value: object, phrase: str) -> None:
    assert_journal_error({"name": "a/b", "max_append_rate": value}, "max_append_rate", phrase)


@pytest.mark.parametrize("value", [-1, "3", 1.5, [1]])
def test_bad_revision(value: object) -> None:
    err = journal_error({"name": "a/b", "revision": value})
    assert err.field == "revision"


# --- labels -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "field", "phrase"),
    [
        ("content-type=x", "labels", "expected a list"),
        ({"content-type": "x"}, "labels", "expected a list"),
        (["content-type"], "labels[0]", "expected a mapping"),
        ([{"value": "x"}], "labels[0].name", "is required"),
        ([{"name": "bad name"}], "labels[0].name", "invalid character ' '"),
        ([{"name": "ok"}, {"name": "-bad"}], "labels[1].name", "begin and end"),
        ([{"name": "a", "value": "b c"}], "labels[0].value", "invalid character ' '"),
        ([{"name": "a", "value": "a=b"}], "labels[0].value", "invalid character '='"),
        ([{"name": "a", "value": 3}], "labels[0].value", "expected a string"),
        ([{"name": "a"}, {"name": "a"}], "labels[1]", "repeats labels[0]"),
        ([{"name": "name", "value": "x/y"}], "labels.name", "implicit"),
        ([{"name": "prefix", "value": "x/"}], "labels.prefix", "implicit"),
        (
            [{"name": "content-type", "value": "a/b"}, {"name": "content-type", "value": "c/d"}],
            "labels.content-type",
            "only one value",
        ),
        (
            [
                {"name": "app.gazette.dev/message-type", "value": "A"},
                {"name": "app.gazette.dev/message-type", "value": "B"},
            ],
            "labels.app.gazette.dev/message-type",
            "only one value",
        ),
    ],
)
def test_bad_labels(labels: object, field: str, phrase: str) -> None:
    assert_journal_error({"name": "a/b", "labels": labels}, field, phrase)


def test_shard_reserved_labels_are_fine_on_journals() -> None:
    spec = JournalSpec.from_dict({"name": "a/b", "labels": [{"name": "id", "value": "x"}]})
    assert spec.labels.value_of("id") == "x"


def test_multi_valued_labels_are_allowed() -> None:
    spec = JournalSpec.from_dict(
        {"name": "a/b", "labels": [{"name": "region", "value": "us-east-1"},
                                   {"name": "region", "value": "eu-west-1"}]}
    )
    assert spec.labels.values("region") == ("eu-west-1", "us-east-1")


# --- fragment ---------------------------------------------------------------------------


@pytest.mark.parametrize("length", [KiB, 4096, 512 * MiB, 16 * GiB])
def test_fragment_length_bounds_ok(length: int) -> None:
    assert FragmentSpec.from_dict({"length": length}).length == length


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        (KiB - 1, "at least 1024 bytes"),
        (0, "at least 1024"),
        (-4096, "at least 1024"),
        (16 * GiB + 1, "at most 17179869184 bytes"),
        (2**70, "at most"),
        ("4KiB", "expected an integer"),
        (4096.0, "expected an integer"),
        (False, "expected an integer"),
    ],
)
def test_bad_fragment_length(value: object, phrase: str) -> None:
    assert_journal_error(with_fields(tutorial(), fragment__length=value),
                         "fragment.length", phrase)


def test_fragment_from_dict_alone_names_its_own_paths() -> None:
    with pytest.raises(ValidationError) as info:
        FragmentSpec.from_dict({"length": 1})
    assert info.value.field == "fragment.length"
    with pytest.raises(ValidationError) as info:
        FragmentSpec.from_dict({"length": 1}, "spec.fragment")
    assert info.value.field == "spec.fragment.length"
    with pytest.raises(ValidationError) as info:
        FragmentSpec.from_dict("length: 1")
    assert info.value.field == "fragment"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("SNAPPY", CompressionCodec.SNAPPY),
        ("snappy", CompressionCodec.SNAPPY),
        ("GZIP", CompressionCodec.GZIP),
        ("NONE", CompressionCodec.NONE),
        ("zstandard", CompressionCodec.ZSTANDARD),
        ("GZIP_OFFLOAD_DECOMPRESSION", CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION),
        (CompressionCodec.GZIP, CompressionCodec.GZIP),
    ],
)
def test_codecs(value: object, expected: CompressionCodec) -> None:
    assert CompressionCodec.parse(value, "c") is expected


@pytest.mark.parametrize("value", ["LZ4", "", "gzip ", 2, True, ["GZIP"]])
def test_unknown_codec(value: object) -> None:
    assert_journal_error(with_fields(tutorial(), fragment__compression_codec=value),
                         "fragment.compression_codec", "unknown codec")


@pytest.mark.parametrize(
    ("stores", "field", "phrase"),
    [
        ("file:///", "fragment.stores", "expected a list"),
        ({"a": "file:///"}, "fragment.stores", "expected a list"),
        (["file:///", "gs://bucket/"], "fragment.stores[1]", "scheme must be one of"),
        (["file:///", 3], "fragment.stores[1]", "expected a URL string"),
        (["file:///", None], "fragment.stores[1]", "expected a URL string"),
        (["file:///a/", "file:///a/"], "fragment.stores[1]", "listed twice"),
        ([f"file:///{i}/" for i in range(9)], "fragment.stores", "at most 8 stores"),
    ],
)
def test_bad_store_lists(stores: object, field: str, phrase: str) -> None:
    assert_journal_error(with_fields(tutorial(), fragment__stores=stores), field, phrase)


# --- fragment durations -----------------------------------------------------------------


@pytest.mark.parametrize("key", ["refresh_interval", "flush_interval", "retention"])
@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ("-1m", "must not be negative"),
        ("soon", "is not a duration"),
        (True, "expected a duration"),
        ("1000000h", "longer than 100 years"),
        (float("inf"), "finite"),
        (float("nan"), "finite"),
        ([], "expected a duration"),
    ],
)
def test_bad_fragment_durations(key: str, value: object, phrase: str) -> None:
    assert_journal_error(with_fields(tutorial(), **{f"fragment__{key}": value}),
                         f"fragment.{key}", phrase)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("1s", True),
        ("24h0m0s", True),
        ("999ms", False),
        ("0s", False),
        ("24h0m1s", False),
    ],
)
def test_refresh_interval_bounds_1s_to_24h(value: str, ok: bool) -> None:
    data = with_fields(tutorial(), fragment__refresh_interval=value)
    if ok:
        JournalSpec.from_dict(data)
    else:
        err = journal_error(data)
        assert err.field == "fragment.refresh_interval"
        assert "at least 1s" in err.reason or "at most 24h0m0s" in err.reason


def test_flush_interval_zero_disables_it() -> None:
    spec = JournalSpec.from_dict(with_fields(tutorial(), fragment__flush_interval="0s"))
    assert spec.fragment.flush_interval == timedelta(0)
    assert_journal_error(with_fields(tutorial(), fragment__flush_interval="500ms"),
                         "fragment.flush_interval", "0 (disabled) or at least 1s")


def test_retention_zero_keeps_forever_and_large_retention_is_fine() -> None:
    spec = JournalSpec.from_dict(with_fields(tutorial(), fragment__retention="8760h"))
    assert spec.fragment.retention == timedelta(days=365)


def test_durations_may_be_seconds() -> None:
    spec = JournalSpec.from_dict(with_fields(tutorial(), fragment__refresh_interval=90))
    assert spec.fragment.refresh_interval == timedelta(seconds=90)


# --- store URLs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "file:///",
        "file:///sub/dir/",
        "s3://my-bucket/",
        "s3://my.bucket-1/prefix/path/",
        "s3://bucket/?endpoint=http://minio:9000&region=us-east-1",
        "s3://bucket/p/?profile=prod&storage_class=STANDARD_IA&sse=aws:kms&acl=private",
        "s3://bucket/?endpoint=",
    ],
)
def test_valid_store_urls(url: str) -> None:
    assert validate_store_url(url, "stores[0]") == url


@pytest.mark.parametrize(
    ("url", "phrase"),
    [
        ("gs://bucket/", "scheme must be one of"),
        ("http://host/", "scheme must be one of"),
        ("/just/a/path/", "scheme must be one of"),
        ("", "scheme must be one of"),
        ("FILE:///a/", "scheme must be one of"),
        ("file://host/", "file stores have no host"),
        ("file://host/path/", "three slashes"),
        ("file:///no-slash", "path must end with '/'"),
        ("s3://bucket", "path must end with '/'"),
        ("s3://bucket/prefix", "path must end with '/'"),
        ("file:relative/", "path must be absolute"),
        ("file:///a/../", "'..'"),
        ("file:///a/./b/", "'.'"),
        ("file:///%2e%2e/etc/", "'..'"),
        ("file:///a%2F..%2F../", "'..'"),
        ("file:///a//b/", "'//'"),
        ("file:///a/?x=1", "no query parameters"),
        ("s3://ab/", "not a valid S3 bucket name"),
        ("s3://" + "b" * 64 + "/", "not a valid S3 bucket name"),
        ("s3://My-Bucket/", "not a valid S3 bucket name"),
        ("s3://-bucket/", "not a valid S3 bucket name"),
        ("s3://bucket-/", "not a valid S3 bucket name"),
        ("s3://b_ucket/", "not a valid S3 bucket name"),
        ("s3://b\u00fccket/", "not a valid S3 bucket name"),
        ("s3://user@bucket/", "not a valid S3 bucket name"),
        ("s3://bucket:9000/", "not a valid S3 bucket name"),
        ("s3:///prefix/", "not a valid S3 bucket name"),
        ("s3://bucket/?foo=1", "unknown parameter 'foo'"),
        ("s3://bucket/?region=a&region=b", "'region' is repeated"),
        ("s3://bucket/?region", "malformed query"),
        ("s3://bucket/#frag", "#fragment"),
        ("file:///a/#", "#fragment"),
        ("s3://[bucket/", "is not a URL"),
        ("file:///a b/", "whitespace"),
        ("file:///a\n/", "whitespace or control"),
        ("s3://bucket/\t/", "whitespace or control"),
        ("file:///a\x00/", "control"),
    ],
)
def test_invalid_store_urls(url: str, phrase: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_store_url(url, "fragment.stores[1]")
    assert info.value.field == "fragment.stores[1]"
    assert phrase in info.value.reason, info.value.reason


@pytest.mark.parametrize("value", [None, 3, b"file:///", ["file:///"]])
def test_store_url_must_be_a_string(value: object) -> None:
    with pytest.raises(ValidationError, match="expected a URL string"):
        validate_store_url(value, "stores[0]")


# --- path postfix templates -------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    ["date={date}/hour={hour}", "y={year}/m={month}/d={day}", "v=1", "date={date}",
     "hour=v1.{hour}"],
)
def test_valid_postfix_templates(template: str) -> None:
    assert FragmentSpec(path_postfix_template=template).path_postfix_template == template


@pytest.mark.parametrize(
    ("template", "phrase"),
    [
        ("{nope}", "unknown placeholder {nope}"),
        ("{}", "unknown placeholder"),
        ("{0}", "unknown placeholder"),
        ("{date:%Y}", "unknown placeholder"),
        ("{date!r}", "unknown placeholder"),
        ("{date.year}", "unknown placeholder"),
        ("{date", "expected '}'"),
        ("date}", "Single '}'"),
        ("/{date}", "must not begin with '/'"),
        ("{date}/", "must not end with '/'"),
        ("a/", "must not end with '/'"),
        ("a//{date}", "'//'"),
        ("{date}/../x", "'..'"),
        ("a b", "invalid character ' '"),
        ("{{literal}}", "invalid character '{'"),
        ("x" * 257, "longer than 256"),
        # Folders are Hive-style key=value: that is how a store listing tells them from
        # the journal's own name.
        ("{year}/{month}", "each folder must be key=value"),
        ("static", "each folder must be key=value"),
        ("date={date}/v1", "each folder must be key=value"),
        ("={date}", "each folder must be key=value"),
    ],
)
def test_invalid_postfix_templates(template: str, phrase: str) -> None:
    assert_journal_error(with_fields(tutorial(), fragment__path_postfix_template=template),
                         "fragment.path_postfix_template", phrase)


def test_postfix_template_must_be_a_string() -> None:
    assert_journal_error(with_fields(tutorial(), fragment__path_postfix_template=3),
                         "fragment.path_postfix_template", "expected a string")


# --- flags ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, JournalFlags.NOT_SPECIFIED),
        ("NOT_SPECIFIED", JournalFlags.NOT_SPECIFIED),
        ([], JournalFlags.NOT_SPECIFIED),
        ("O_RDONLY", JournalFlags.O_RDONLY),
        (" o_wronly ", JournalFlags.O_WRONLY),
        (["O_RDWR"], JournalFlags.O_RDWR),
        (["O_RDONLY", "O_RDONLY"], JournalFlags.O_RDONLY),
        (1, JournalFlags.O_RDONLY),
        (2, JournalFlags.O_WRONLY),
        (4, JournalFlags.O_RDWR),
    ],
)
def test_flags(value: object, expected: JournalFlags) -> None:
    assert JournalFlags.parse(value, "flags") is expected
    spec = JournalSpec.from_dict({"name": "a/b", "flags": value})
    assert spec.flags is expected


@pytest.mark.parametrize(
    ("value", "field", "phrase"),
    [
        ("O_APPEND", "flags", "unknown flag 'O_APPEND'"),
        ("", "flags", "unknown flag"),
        (["O_RDONLY", "BAD"], "flags[1]", "unknown flag 'BAD'"),
        (["O_RDONLY", 2], "flags[1]", "unknown flag 2"),
        ([None], "flags[0]", "unknown flag"),
        (["O_RDONLY", "O_WRONLY"], "flags", "O_RDONLY and O_WRONLY together"),
        (3, "flags", "O_RDONLY and O_WRONLY together"),
        (["O_RDWR", "O_RDONLY"], "flags", "O_RDWR cannot be combined"),
        (5, "flags", "O_RDWR cannot be combined"),
        (6, "flags", "O_RDWR cannot be combined"),
        (8, "flags", "not a combination of known flags"),
        (-1, "flags", "not a combination of known flags"),
        (2**40, "flags", "not a combination of known flags"),
        (True, "flags", "expected flag names"),
        ({"O_RDONLY": True}, "flags", "expected flag names"),
        (1.0, "flags", "expected flag names"),
    ],
)
def test_bad_flags(value: object, field: str, phrase: str) -> None:
    assert_journal_error({"name": "a/b", "flags": value}, field, phrase)


def test_flag_permissions() -> None:
    assert JournalFlags.NOT_SPECIFIED.may_read and JournalFlags.NOT_SPECIFIED.may_write
    assert JournalFlags.O_RDWR.may_read and JournalFlags.O_RDWR.may_write
    assert JournalFlags.O_RDONLY.may_read and not JournalFlags.O_RDONLY.may_write
    assert not JournalFlags.O_WRONLY.may_read and JournalFlags.O_WRONLY.may_write
    assert JournalFlags.NOT_SPECIFIED.format() == "NOT_SPECIFIED"
    assert JournalFlags.O_WRONLY.format() == "O_WRONLY"


# --- suspend ----------------------------------------------------------------------------


def test_suspend() -> None:
    spec = JournalSpec.from_dict({"name": "a/b", "suspend": {"level": "partial", "offset": 10}})
    assert spec.suspend == Suspend(SuspendLevel.PARTIAL, 10)
    assert Suspend.from_dict({}) == Suspend(SuspendLevel.NONE, 0)


@pytest.mark.parametrize(
    ("suspend", "field", "phrase"),
    [
        ({"level": "HALF"}, "suspend.level", "unknown level 'HALF'"),
        ({"level": 1}, "suspend.level", "unknown level 1"),
        ({"offset": -1}, "suspend.offset", "at least 0"),
        ({"offset": INT64_MAX + 1}, "suspend.offset", "at most"),
        ({"offset": "10"}, "suspend.offset", "expected an integer"),
        ({"lvl": "FULL"}, "suspend.lvl", "unknown field"),
        ("FULL", "suspend", "expected a mapping"),
        ([], "suspend", "expected a mapping"),
    ],
)
def test_bad_suspend(suspend: object, field: str, phrase: str) -> None:
    assert_journal_error({"name": "a/b", "suspend": suspend}, field, phrase)


# --- direct construction is checked too ---------------------------------------------------

# Untyped callers may pass anything: these aliases let the tests do so too.
_JournalSpec: Any = JournalSpec
_FragmentSpec: Any = FragmentSpec
_Suspend: Any = Suspend


@pytest.mark.parametrize(
    ("make", "field", "phrase"),
    [
        (lambda: _JournalSpec("a//b"), "name", "'//'"),
        (lambda: _JournalSpec("a/b", replication="3"), "replication", "expected an integer"),
        (lambda: _JournalSpec("a/b", replication=True), "replication", "expected an integer"),
        (lambda: _JournalSpec("a/b", replication=0), "replication", "at least 1"),
        (lambda: _JournalSpec("a/b", labels=[("a", "b")]), "labels", "expected a LabelSet"),
        (lambda: _JournalSpec("a/b", labels=LabelSet([("name", "x")])), "labels.name",
         "implicit"),
        (lambda: _JournalSpec("a/b", fragment={}), "fragment", "expected a FragmentSpec"),
        (lambda: _JournalSpec("a/b", flags=1), "flags", "expected JournalFlags"),
        (lambda: _JournalSpec("a/b", flags=JournalFlags(3)), "flags", "together"),
        (lambda: _JournalSpec("a/b", max_append_rate=-1), "max_append_rate", "at least 0"),
        (lambda: _JournalSpec("a/b", suspend={"level": "FULL"}), "suspend", "expected a Suspend"),
        (lambda: _Suspend("FULL"), "level", "expected a SuspendLevel"),
        (lambda: _Suspend(offset=-1), "offset", "at least 0"),
        (lambda: _FragmentSpec(length=1.5), "length", "expected an integer"),
        (lambda: _FragmentSpec(compression_codec="GZIP"), "compression_codec", "no codec"),
        (lambda: _FragmentSpec(stores=("gs://b/",)), "stores[0]", "scheme"),
        (lambda: _FragmentSpec(refresh_interval=60), "refresh_interval", "expected a duration"),
        (lambda: _FragmentSpec(retention=timedelta(days=365 * 101)), "retention", "at most"),
        (lambda: _FragmentSpec(retention=timedelta(seconds=-1)), "retention", "at least 0s"),
    ],
)
def test_direct_construction_is_validated(make: Any, field: str, phrase: str) -> None:
    with pytest.raises(ValidationError) as info:
        make()
    assert info.value.field == field, str(info.value)
    assert phrase in info.value.reason, str(info.value)


def test_specs_are_frozen_and_hashable_by_value() -> None:
    a = JournalSpec.from_dict(tutorial())
    b = JournalSpec.from_dict(tutorial())
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.replication = 2  # type: ignore[misc]
