"""Conversions between our spec types and their protobuf messages.

Messages come off the wire or out of etcd and may be anything, so every ``*_from_pb``
validates as it builds (a bad message raises `ValidationError` naming the field), and
``*_to_pb`` of a valid spec always gives a valid message.
"""

from __future__ import annotations

from datetime import timedelta

from google.protobuf import duration_pb2

from gazette.errors import ValidationError
from gazette.labels import Label, LabelSet, Selector
from gazette.pb import broker_pb2 as bpb
from gazette.pb import consumer_pb2 as cpb
from gazette.protocol.fields import build
from gazette.protocol.journal_spec import (
    CompressionCodec,
    FragmentSpec,
    JournalFlags,
    JournalSpec,
    Suspend,
    SuspendLevel,
)
from gazette.protocol.member_spec import MemberSpec, ProcessId
from gazette.protocol.shard_spec import (
    DEFAULT_READ_CHANNEL_SIZE,
    DEFAULT_RING_BUFFER_SIZE,
    ShardSource,
    ShardSpec,
)

_CODEC_TO_PB = {c: bpb.CompressionCodec.Value(c.value) for c in CompressionCodec}
_CODEC_FROM_PB = {v: k for k, v in _CODEC_TO_PB.items()}
_SUSPEND_TO_PB = {lv: bpb.JournalSpec.Suspend.Level.Value(lv.value) for lv in SuspendLevel}
_SUSPEND_FROM_PB = {v: k for k, v in _SUSPEND_TO_PB.items()}


def codec_to_pb(codec: CompressionCodec) -> bpb.CompressionCodec.ValueType:
    return _CODEC_TO_PB[codec]


def codec_from_pb(value: int, field: str = "compression_codec") -> CompressionCodec:
    if value not in _CODEC_FROM_PB:
        raise ValidationError(field, f"unknown or unset codec {value}")
    return _CODEC_FROM_PB[value]  # type: ignore[index]


def duration_to_pb(value: timedelta) -> duration_pb2.Duration:
    msg = duration_pb2.Duration()
    msg.FromTimedelta(value)
    return msg


def duration_from_pb(msg: duration_pb2.Duration, field: str) -> timedelta:
    if msg.nanos < 0 or msg.seconds < 0:
        raise ValidationError(field, "must not be negative")
    try:
        return msg.ToTimedelta()
    except (OverflowError, ValueError) as exc:
        raise ValidationError(field, f"out of range: {exc}") from None


def labels_to_pb(labels: LabelSet) -> bpb.LabelSet:
    return bpb.LabelSet(labels=[bpb.Label(name=lb.name, value=lb.value) for lb in labels])


def labels_from_pb(msg: bpb.LabelSet, field: str = "labels") -> LabelSet:
    return LabelSet([Label(lb.name, lb.value) for lb in msg.labels], field=field)


def selector_to_pb(selector: Selector) -> bpb.LabelSelector:
    return bpb.LabelSelector(include=labels_to_pb(selector.include),
                             exclude=labels_to_pb(selector.exclude))


def selector_from_pb(msg: bpb.LabelSelector, field: str = "selector") -> Selector:
    return Selector(labels_from_pb(msg.include, f"{field}.include"),
                    labels_from_pb(msg.exclude, f"{field}.exclude"))


def journal_spec_to_pb(spec: JournalSpec) -> bpb.JournalSpec:
    f = spec.fragment
    msg = bpb.JournalSpec(
        name=spec.name,
        replication=spec.replication,
        labels=labels_to_pb(spec.labels),
        fragment=bpb.JournalSpec.Fragment(
            length=f.length,
            compression_codec=_CODEC_TO_PB[f.compression_codec],
            stores=list(f.stores),
            refresh_interval=duration_to_pb(f.refresh_interval),
            retention=duration_to_pb(f.retention),
            flush_interval=duration_to_pb(f.flush_interval),
            path_postfix_template=f.path_postfix_template,
        ),
        flags=int(spec.flags),
        max_append_rate=spec.max_append_rate,
    )
    if spec.suspend is not None:
        msg.suspend.CopyFrom(bpb.JournalSpec.Suspend(
            level=_SUSPEND_TO_PB[spec.suspend.level], offset=spec.suspend.offset))
    return msg


def journal_spec_from_pb(msg: bpb.JournalSpec) -> JournalSpec:
    f = msg.fragment
    codec = codec_from_pb(f.compression_codec, "fragment.compression_codec")
    fragment = build(
        FragmentSpec, "fragment",
        length=f.length,
        compression_codec=codec,
        stores=tuple(f.stores),
        refresh_interval=duration_from_pb(f.refresh_interval, "fragment.refresh_interval"),
        retention=duration_from_pb(f.retention, "fragment.retention"),
        flush_interval=duration_from_pb(f.flush_interval, "fragment.flush_interval"),
        path_postfix_template=f.path_postfix_template,
    )
    suspend = None
    if msg.HasField("suspend"):
        if msg.suspend.level not in _SUSPEND_FROM_PB:
            raise ValidationError("suspend.level", f"unknown level {msg.suspend.level}")
        suspend = build(Suspend, "suspend", level=_SUSPEND_FROM_PB[msg.suspend.level],
                        offset=msg.suspend.offset)
    return JournalSpec(
        name=msg.name,
        replication=msg.replication,
        labels=labels_from_pb(msg.labels),
        fragment=fragment,
        flags=JournalFlags.parse(msg.flags, "flags"),
        max_append_rate=msg.max_append_rate,
        suspend=suspend,
    )


def shard_spec_to_pb(spec: ShardSpec) -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=spec.id,
        sources=[cpb.ShardSpec.Source(journal=s.journal, min_offset=s.min_offset)
                 for s in spec.sources],
        recovery_log_prefix=spec.recovery_log_prefix,
        hint_prefix=spec.hint_prefix,
        hint_backups=spec.hint_backups,
        max_txn_duration=duration_to_pb(spec.max_txn_duration),
        min_txn_duration=duration_to_pb(spec.min_txn_duration),
        disable=spec.disable,
        hot_standbys=spec.hot_standbys,
        labels=labels_to_pb(spec.labels),
        disable_wait_for_ack=spec.disable_wait_for_ack,
        ring_buffer_size=spec.ring_buffer_size,
        read_channel_size=spec.read_channel_size,
    )


def shard_spec_from_pb(msg: cpb.ShardSpec) -> ShardSpec:
    return ShardSpec(
        id=msg.id,
        sources=tuple(build(ShardSource, f"sources[{i}]", journal=s.journal,
                            min_offset=s.min_offset) for i, s in enumerate(msg.sources)),
        recovery_log_prefix=msg.recovery_log_prefix,
        hint_prefix=msg.hint_prefix,
        hint_backups=msg.hint_backups,
        max_txn_duration=duration_from_pb(msg.max_txn_duration, "max_txn_duration"),
        min_txn_duration=duration_from_pb(msg.min_txn_duration, "min_txn_duration"),
        disable=msg.disable,
        hot_standbys=msg.hot_standbys,
        labels=labels_from_pb(msg.labels),
        disable_wait_for_ack=msg.disable_wait_for_ack,
        # "Zero means the default" (consumer.proto): what proto3 gives when they are unset.
        ring_buffer_size=msg.ring_buffer_size or DEFAULT_RING_BUFFER_SIZE,
        read_channel_size=msg.read_channel_size or DEFAULT_READ_CHANNEL_SIZE,
    )


def _process_spec_to_pb(spec: MemberSpec) -> bpb.ProcessSpec:
    return bpb.ProcessSpec(id=bpb.ProcessSpec.ID(zone=spec.id.zone, suffix=spec.id.suffix),
                           endpoint=spec.endpoint)


def _member_from_pb(ps: bpb.ProcessSpec, limit: int, field: str,
                    limit_field: str, store_schemes: tuple[str, ...] = (),
                    data_endpoint: str = "") -> MemberSpec:
    pid = build(ProcessId, f"{field}.id", zone=ps.id.zone, suffix=ps.id.suffix)
    try:
        return MemberSpec(id=pid, endpoint=ps.endpoint, item_limit=limit,
                          store_schemes=store_schemes, data_endpoint=data_endpoint)
    except ValidationError as err:
        # Name the message's fields, not the dataclass's.
        raise ValidationError(
            limit_field if err.field == "item_limit" else
            err.field if err.field == "data_endpoint" else f"{field}.{err.field}", err.reason
        ) from None


def broker_spec_to_pb(spec: MemberSpec) -> bpb.BrokerSpec:
    return bpb.BrokerSpec(process_spec=_process_spec_to_pb(spec), journal_limit=spec.item_limit,
                          store_schemes=list(spec.store_schemes),
                          data_endpoint=spec.data_endpoint)


def broker_spec_from_pb(msg: bpb.BrokerSpec) -> MemberSpec:
    return _member_from_pb(msg.process_spec, msg.journal_limit, "process_spec", "journal_limit",
                           tuple(msg.store_schemes), msg.data_endpoint)


def consumer_spec_to_pb(spec: MemberSpec) -> cpb.ConsumerSpec:
    return cpb.ConsumerSpec(process_spec=_process_spec_to_pb(spec), shard_limit=spec.item_limit)


def consumer_spec_from_pb(msg: cpb.ConsumerSpec) -> MemberSpec:
    return _member_from_pb(msg.process_spec, msg.shard_limit, "process_spec", "shard_limit")
