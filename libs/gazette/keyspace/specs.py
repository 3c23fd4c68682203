"""Specs in etcd: how items and members are encoded, decoded and applied.

Items (JournalSpecs, ShardSpecs) and member specs are stored as protobuf messages; an
assignment's value is the route its member acknowledged (raw bytes); a status key's, a
`ReplicaStatus`. Applying a batch of spec changes is one etcd
transaction guarded by each item's mod revision, so concurrent editors never silently
overwrite each other: the loser gets a `TxnConflict` naming what changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gazette.errors import ValidationError
from gazette.keyspace.etcd import Etcd, KeyValue
from gazette.keyspace.layout import AssignmentKey, ItemKey, Layout, MemberKey, StatusKey
from gazette.keyspace.txn import Txn
from gazette.pb import broker_pb2 as bpb
from gazette.pb import consumer_pb2 as cpb
from gazette.protocol import (
    JournalSpec,
    MemberSpec,
    ReplicaStatus,
    ShardSpec,
    broker_spec_from_pb,
    broker_spec_to_pb,
    consumer_spec_from_pb,
    consumer_spec_to_pb,
    journal_spec_from_pb,
    journal_spec_to_pb,
    shard_spec_from_pb,
    shard_spec_to_pb,
)
from gazette.protocol.trees import SpecChange

#: etcd's default --max-txn-ops; larger batches must be split by the caller.
MAX_TXN_OPS = 128


def encode_item(spec: JournalSpec | ShardSpec) -> bytes:
    if isinstance(spec, JournalSpec):
        return journal_spec_to_pb(spec).SerializeToString()
    return shard_spec_to_pb(spec).SerializeToString()


def decode_journal(value: bytes) -> JournalSpec:
    return journal_spec_from_pb(bpb.JournalSpec.FromString(value))


def decode_shard(value: bytes) -> ShardSpec:
    return shard_spec_from_pb(cpb.ShardSpec.FromString(value))


def encode_broker(spec: MemberSpec) -> bytes:
    return broker_spec_to_pb(spec).SerializeToString()


def decode_broker(value: bytes) -> MemberSpec:
    return broker_spec_from_pb(bpb.BrokerSpec.FromString(value))


def encode_consumer(spec: MemberSpec) -> bytes:
    return consumer_spec_to_pb(spec).SerializeToString()


def decode_consumer(value: bytes) -> MemberSpec:
    return consumer_spec_from_pb(cpb.ConsumerSpec.FromString(value))


class Decoder:
    """Decodes every key under a cluster's or application's root by what it is."""

    def __init__(self, layout: Layout, *, consumers: bool = False) -> None:
        self.layout = layout
        self.item = decode_shard if consumers else decode_journal
        self.member = decode_consumer if consumers else decode_broker

    def __call__(self, kv: KeyValue) -> Any:
        key = self.layout.parse(kv.key)
        if isinstance(key, ItemKey):
            spec = self.item(kv.value)
            name = spec.id if isinstance(spec, ShardSpec) else spec.name
            if name != key.item:
                raise ValidationError("key", f"spec named {name!r} stored under {kv.key!r}")
            return spec
        if isinstance(key, MemberKey):
            return self.member(kv.value)
        if isinstance(key, StatusKey):
            return ReplicaStatus.decode(kv.value)
        assert isinstance(key, AssignmentKey)
        return kv.value


async def apply_changes(etcd: Etcd, layout: Layout,
                        changes: Sequence[SpecChange[Any]]) -> int:
    """Apply spec changes in one transaction; returns its revision.

    Raises `TxnConflict` (nothing applied) when any item is not at its expected revision,
    and `ValidationError` for a batch etcd could not take in one transaction.
    """
    if not changes:
        raise ValidationError("changes", "nothing to apply")
    if len(changes) > MAX_TXN_OPS:
        raise ValidationError(
            "changes", f"{len(changes)} changes exceed one etcd transaction "
            f"({MAX_TXN_OPS}); apply them in batches")
    txn = Txn()
    seen: set[str] = set()
    for change in changes:
        if change.name in seen:
            raise ValidationError(change.name, "is changed twice in one apply")
        seen.add(change.name)
        key = layout.item_key(change.name)
        txn.expect(key, change.revision)
        if change.spec is None:
            if change.revision == 0:
                raise ValidationError(f"{change.name}: revision",
                                      "a delete needs the revision of the item it deletes")
            txn.delete(key)
        else:
            txn.put(key, encode_item(change.spec))
    return (await txn.commit(etcd)).revision
