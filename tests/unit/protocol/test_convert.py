"""Spec <-> protobuf conversions, etcd encodings, and what bad messages and bytes raise.

Decoding untrusted bytes (`decode_journal`, `decode_shard`, `decode_broker`,
`decode_consumer`) raises exactly one of two errors:

- `google.protobuf.message.DecodeError` when the bytes are not a message of that type;
- `ValidationError` (naming the message's field) when they are, but describe an invalid spec.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.keyspace.etcd import KeyValue
from gazette.keyspace.layout import Layout
from gazette.keyspace.specs import (
    Decoder,
    decode_broker,
    decode_consumer,
    decode_journal,
    decode_shard,
    encode_broker,
    encode_item,
)
from gazette.labels import LabelSet, parse_selector
from gazette.pb import broker_pb2 as bpb
from gazette.pb import consumer_pb2 as cpb
from gazette.protocol import (
    CompressionCodec,
    FragmentSpec,
    JournalFlags,
    JournalSpec,
    MemberSpec,
    ProcessId,
    ShardSource,
    ShardSpec,
    Suspend,
    SuspendLevel,
    broker_spec_from_pb,
    broker_spec_to_pb,
    consumer_spec_from_pb,
    consumer_spec_to_pb,
    journal_spec_from_pb,
    journal_spec_to_pb,
    labels_from_pb,
    labels_to_pb,
    selector_from_pb,
    selector_to_pb,
    shard_spec_from_pb,
    shard_spec_to_pb,
)
from gazette.protocol.convert import duration_from_pb, duration_to_pb

JOURNAL = JournalSpec(
    "example/journal",
    replication=1,
    labels=LabelSet([("app.gazette.dev/message-type", "TestMessage"),
                     ("content-type", "application/x-ndjson"), ("my-label", "")]),
    fragment=FragmentSpec(
        length=131072,
        compression_codec=CompressionCodec.GZIP,
        stores=("file:///", "s3://bucket/prefix/?region=us-east-1"),
        refresh_interval=timedelta(minutes=1),
        retention=timedelta(hours=1),
        flush_interval=timedelta(0),
        path_postfix_template="date={date}",
    ),
    flags=JournalFlags.O_RDWR,
    max_append_rate=1 << 20,
    suspend=Suspend(SuspendLevel.FULL, 1234),
)
SHARD = ShardSpec(
    "word-count/part-000",
    (ShardSource("a/b", 10), ShardSource("c/d")),
    recovery_log_prefix="recovery",
    hint_prefix="/gazette/hints",
    hint_backups=2,
    max_txn_duration=timedelta(seconds=2),
    min_txn_duration=timedelta(milliseconds=5),
    disable=True,
    hot_standbys=3,
    labels=LabelSet([("app", "word-count")]),
    disable_wait_for_ack=True,
    ring_buffer_size=100,
    read_channel_size=200,
)
MEMBER = MemberSpec(ProcessId("local", "busy-walrus"), "http://roland:8080", 77)


def assert_pb_error(fn: Callable[[Any], object], msg: object, field: str, phrase: str) -> None:
    with pytest.raises(ValidationError) as info:
        fn(msg)
    assert info.value.field == field, str(info.value)
    assert phrase in info.value.reason, str(info.value)


# --- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("spec", [JOURNAL, JournalSpec("a/b")])
def test_journal_round_trips(spec: JournalSpec) -> None:
    assert journal_spec_from_pb(journal_spec_to_pb(spec)) == spec
    assert decode_journal(encode_item(spec)) == spec


@pytest.mark.parametrize("spec", [SHARD, ShardSpec("s", (ShardSource("a/b"),))])
def test_shard_round_trips(spec: ShardSpec) -> None:
    assert shard_spec_from_pb(shard_spec_to_pb(spec)) == spec
    assert decode_shard(encode_item(spec)) == spec


def test_member_round_trips() -> None:
    assert broker_spec_from_pb(broker_spec_to_pb(MEMBER)) == MEMBER
    assert consumer_spec_from_pb(consumer_spec_to_pb(MEMBER)) == MEMBER
    assert decode_broker(encode_broker(MEMBER)) == MEMBER
    consumer_bytes = consumer_spec_to_pb(MEMBER).SerializeToString()
    assert decode_consumer(consumer_bytes) == MEMBER
    assert broker_spec_to_pb(MEMBER).journal_limit == 77
    assert consumer_spec_to_pb(MEMBER).shard_limit == 77


def test_tutorial_spec_to_pb_fields() -> None:
    msg = journal_spec_to_pb(JOURNAL)
    assert msg.fragment.compression_codec == bpb.CompressionCodec.GZIP
    assert msg.fragment.refresh_interval.seconds == 60
    assert msg.flags == 4
    assert msg.suspend.level == bpb.JournalSpec.Suspend.Level.FULL
    assert not journal_spec_to_pb(JournalSpec("a/b")).HasField("suspend")


def test_labels_and_selectors_round_trip() -> None:
    labels = LabelSet([("a", "1"), ("a", "2"), ("b", "")])
    assert labels_from_pb(labels_to_pb(labels)) == labels
    sel = parse_selector("prefix=foobar/, name notin (foobar/part-001), !gone")
    assert selector_from_pb(selector_to_pb(sel)) == sel


def test_bad_labels_and_selectors_from_pb() -> None:
    msg = bpb.LabelSet(labels=[bpb.Label(name="ok"), bpb.Label(name="bad name")])
    assert_pb_error(labels_from_pb, msg, "labels[1].name", "invalid character ' '")
    sel = bpb.LabelSelector(exclude=bpb.LabelSet(labels=[bpb.Label(name="a", value="x y")]))
    assert_pb_error(selector_from_pb, sel, "selector.exclude[0].value", "invalid character")


def test_durations() -> None:
    assert duration_from_pb(duration_to_pb(timedelta(seconds=1.5)), "d") == timedelta(
        seconds=1.5)
    with pytest.raises(ValidationError, match="must not be negative"):
        duration_from_pb(duration_to_pb(timedelta(seconds=-1)), "d")


# --- invalid journal messages -----------------------------------------------------------


def journal_pb(**changes: Any) -> bpb.JournalSpec:
    """A valid message, changed by ``field=value`` or ``fragment__field=value``."""
    msg = journal_spec_to_pb(JOURNAL)
    for key, value in changes.items():
        target: Any = msg
        *path, last = key.split("__")
        for part in path:
            target = getattr(target, part)
        if isinstance(value, list):
            del getattr(target, last)[:]
            getattr(target, last).extend(value)
        else:
            setattr(target, last, value)
    return msg


@pytest.mark.parametrize(
    ("changes", "field", "phrase"),
    [
        ({"fragment__compression_codec": 0}, "fragment.compression_codec", "unset codec 0"),
        ({"fragment__compression_codec": 99}, "fragment.compression_codec", "unknown"),
        ({"fragment__refresh_interval__seconds": -1}, "fragment.refresh_interval",
         "must not be negative"),
        ({"fragment__retention__nanos": -1}, "fragment.retention", "must not be negative"),
        ({"fragment__flush_interval__seconds": -60}, "fragment.flush_interval",
         "must not be negative"),
        ({"fragment__refresh_interval__seconds": 0}, "fragment.refresh_interval",
         "at least 1s"),
        ({"fragment__retention__seconds": 10**12}, "fragment.retention", "at most"),
        ({"fragment__retention__seconds": 2**62}, "fragment.retention", "out of range"),
        ({"fragment__length": 0}, "fragment.length", "at least 1024"),
        ({"fragment__stores": ["file:///", "gs://b/"]}, "fragment.stores[1]", "scheme"),
        ({"fragment__path_postfix_template": "{x}"}, "fragment.path_postfix_template",
         "unknown placeholder"),
        ({"name": ""}, "name", "shorter than 2"),
        ({"name": "a//b"}, "name", "'//'"),
        ({"name": "a=b/c"}, "name", "invalid character '='"),
        ({"replication": 0}, "replication", "at least 1"),
        ({"replication": -3}, "replication", "at least 1"),
        ({"flags": 3}, "flags", "O_RDONLY and O_WRONLY together"),
        ({"flags": 8}, "flags", "not a combination"),
        ({"max_append_rate": -1}, "max_append_rate", "at least 0"),
        ({"suspend__level": 7}, "suspend.level", "unknown level 7"),
        ({"suspend__offset": -1}, "suspend.offset", "at least 0"),
        ({"labels__labels": [bpb.Label(name="-x")]}, "labels[0].name", "begin and end"),
        ({"labels__labels": [bpb.Label(name="a", value="b=c")]}, "labels[0].value",
         "invalid character '='"),
        ({"labels__labels": [bpb.Label(name="name", value="x")]}, "labels.name", "implicit"),
        ({"labels__labels": [bpb.Label(name="content-type", value="a"),
                             bpb.Label(name="content-type", value="b")]},
         "labels.content-type", "only one value"),
    ],
)
def test_invalid_journal_messages(changes: dict[str, Any], field: str, phrase: str) -> None:
    msg = journal_pb(**changes)
    assert_pb_error(journal_spec_from_pb, msg, field, phrase)
    assert_pb_error(decode_journal, msg.SerializeToString(), field, phrase)


def test_empty_journal_message_is_invalid() -> None:
    with pytest.raises(ValidationError) as info:
        journal_spec_from_pb(bpb.JournalSpec())
    assert info.value.field == "fragment.compression_codec"
    with pytest.raises(ValidationError):
        decode_journal(b"")


# --- invalid shard and member messages ---------------------------------------------------


def shard_pb(**changes: Any) -> cpb.ShardSpec:
    msg = shard_spec_to_pb(SHARD)
    for key, value in changes.items():
        target: Any = msg
        *path, last = key.split("__")
        for part in path:
            target = getattr(target, part) if not part.isdigit() else target[int(part)]
        setattr(target, last, value)
    return msg


@pytest.mark.parametrize(
    ("changes", "field", "phrase"),
    [
        ({"id": ""}, "id", "must not be empty"),
        ({"id": "a/"}, "id", "must not end with '/'"),
        ({"sources__1__journal": "x"}, "sources[1].journal", "shorter than 2"),
        ({"sources__1__journal": "a/b"}, "sources[1].journal", "already sources[0]"),
        ({"sources__0__min_offset": -1}, "sources[0].min_offset", "at least 0"),
        ({"recovery_log_prefix": "/r"}, "recovery_log_prefix", "must not begin with '/'"),
        ({"hint_prefix": ""}, "hint_prefix", "is required with a recovery_log_prefix"),
        ({"hint_prefix": "hints"}, "hint_prefix", "must begin with '/'"),
        ({"hint_backups": 17}, "hint_backups", "at most 16"),
        ({"max_txn_duration__seconds": 0}, "max_txn_duration", "at least 1ms"),
        ({"max_txn_duration__seconds": -1}, "max_txn_duration", "must not be negative"),
        ({"min_txn_duration__nanos": -5}, "min_txn_duration", "must not be negative"),
        ({"min_txn_duration__seconds": 3}, "min_txn_duration", "exceeds max_txn_duration"),
        ({"hot_standbys": -1}, "hot_standbys", "at least 0"),
        ({"ring_buffer_size": -1}, "ring_buffer_size", "at least 1"),
        ({"ring_buffer_size": (1 << 24) + 1}, "ring_buffer_size", "at most"),
        ({"read_channel_size": -1}, "read_channel_size", "at least 1"),
    ],
)
def test_invalid_shard_messages(changes: dict[str, Any], field: str, phrase: str) -> None:
    msg = shard_pb(**changes)
    assert_pb_error(shard_spec_from_pb, msg, field, phrase)
    assert_pb_error(decode_shard, msg.SerializeToString(), field, phrase)


def test_unset_buffer_sizes_mean_the_defaults() -> None:
    """consumer.proto: "Zero means the default" for both sizes, as proto3 leaves them unset."""
    msg = shard_spec_to_pb(SHARD)
    msg.ClearField("ring_buffer_size")
    msg.ClearField("read_channel_size")
    spec = shard_spec_from_pb(msg)
    assert spec.ring_buffer_size == 8192 and spec.read_channel_size == 4096


def test_shard_labels_from_pb() -> None:
    msg = shard_spec_to_pb(SHARD)
    msg.labels.labels.add(name="id", value="x")
    assert_pb_error(shard_spec_from_pb, msg, "labels.id", "implicit")
    msg = shard_spec_to_pb(SHARD)
    msg.labels.labels.add(name="", value="x")
    assert_pb_error(shard_spec_from_pb, msg, "labels[1].name", "must not be empty")


def test_shard_without_sources_from_pb() -> None:
    msg = shard_spec_to_pb(SHARD)
    del msg.sources[:]
    assert_pb_error(shard_spec_from_pb, msg, "sources", "at least one source")


@pytest.mark.parametrize(
    ("change", "field", "phrase"),
    [
        (lambda m: setattr(m.process_spec, "endpoint", "roland:8080"), "process_spec.endpoint",
         "http://host:port"),
        (lambda m: setattr(m.process_spec.id, "zone", ""), "process_spec.id.zone",
         "must not be empty"),
        (lambda m: setattr(m.process_spec.id, "suffix", "a#b"), "process_spec.id.suffix",
         "invalid character '#'"),
    ],
)
def test_invalid_member_messages(change: Callable[[Any], None], field: str, phrase: str) -> None:
    broker = broker_spec_to_pb(MEMBER)
    change(broker)
    assert_pb_error(broker_spec_from_pb, broker, field, phrase)
    assert_pb_error(decode_broker, broker.SerializeToString(), field, phrase)
    consumer = consumer_spec_to_pb(MEMBER)
    change(consumer)
    assert_pb_error(consumer_spec_from_pb, consumer, field, phrase)


def test_member_limits_name_the_message_field() -> None:
    broker = broker_spec_to_pb(MEMBER)
    broker.journal_limit = -1
    assert_pb_error(broker_spec_from_pb, broker, "journal_limit", "at least 0")
    consumer = consumer_spec_to_pb(MEMBER)
    consumer.shard_limit = (1 << 20) + 1
    assert_pb_error(consumer_spec_from_pb, consumer, "shard_limit", "at most")


# --- the etcd decoder -------------------------------------------------------------------


def kv(key: str, value: bytes) -> KeyValue:
    return KeyValue(key=key, value=value, create_revision=1, mod_revision=2, version=1, lease=0)


def test_decoder_by_key_kind() -> None:
    brokers = Layout.brokers()
    decode = Decoder(brokers)
    assert decode(kv(brokers.item_key(JOURNAL.name), encode_item(JOURNAL))) == JOURNAL
    assert decode(kv(brokers.member_key("local", "busy-walrus"), encode_broker(MEMBER))) == MEMBER
    key = brokers.assignment_key(JOURNAL.name, "local", "busy-walrus", 0)
    assert decode(kv(key, b"\x08\x01")) == b"\x08\x01"

    app = Layout.consumer_app("word-count")
    decode = Decoder(app, consumers=True)
    assert decode(kv(app.item_key(SHARD.id), encode_item(SHARD))) == SHARD
    member_bytes = consumer_spec_to_pb(MEMBER).SerializeToString()
    assert decode(kv(app.member_key("local", "busy-walrus"), member_bytes)) == MEMBER


def test_decoder_rejects_misfiled_specs_and_bad_keys() -> None:
    brokers = Layout.brokers()
    decode = Decoder(brokers)
    with pytest.raises(ValidationError) as info:
        decode(kv(brokers.item_key("other/journal"), encode_item(JOURNAL)))
    assert info.value.field == "key" and "stored under" in info.value.reason
    with pytest.raises(ValidationError) as info:
        decode(kv("/gazette/cluster/unknown/x", b""))
    assert info.value.field == "key"


# --- arbitrary bytes ------------------------------------------------------------------

DECODERS = [decode_journal, decode_shard, decode_broker, decode_consumer]


def _decode_or_expected_error(decode: Callable[[bytes], object], data: bytes) -> None:
    try:
        decode(data)
    except ValidationError as err:
        assert err.reason
    except DecodeError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(DECODERS), st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_decode_or_validation_errors(
    decode: Callable[[bytes], object], data: bytes
) -> None:
    _decode_or_expected_error(decode, data)


_VALID_ENCODINGS = [
    (decode_journal, encode_item(JOURNAL)),
    (decode_shard, encode_item(SHARD)),
    (decode_broker, encode_broker(MEMBER)),
    (decode_consumer, consumer_spec_to_pb(MEMBER).SerializeToString()),
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_VALID_ENCODINGS), st.data())
def test_mutated_encodings_raise_only_decode_or_validation_errors(
    pair: tuple[Callable[[bytes], object], bytes], data: st.DataObject
) -> None:
    """Valid messages with bytes flipped, cut or spliced reach deeper than random bytes."""
    decode, encoded = pair
    buf = bytearray(encoded)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip":
            buf[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del buf[i:i + data.draw(st.integers(1, 8))]
            if not buf:
                break
        else:
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    _decode_or_expected_error(decode, bytes(buf))
