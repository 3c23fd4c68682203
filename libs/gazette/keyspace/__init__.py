"""etcd: the client, mirrored keyspaces, revision-guarded transactions and leases."""

from gazette.keyspace.etcd import Etcd, EtcdError, Event, KeyValue, LeaseNotFound, RangeResult
from gazette.keyspace.keyspace import Entry, KeySpace
from gazette.keyspace.layout import BROKER_ROOT, CONSUMER_ROOT, Layout
from gazette.keyspace.lease import Lease, LeaseLost
from gazette.keyspace.specs import (
    MAX_TXN_OPS,
    Decoder,
    apply_changes,
    encode_broker,
    encode_consumer,
    encode_item,
)
from gazette.keyspace.txn import Txn, TxnConflict, TxnResult

__all__ = [
    "BROKER_ROOT",
    "CONSUMER_ROOT",
    "MAX_TXN_OPS",
    "Decoder",
    "Entry",
    "Etcd",
    "EtcdError",
    "Event",
    "KeySpace",
    "KeyValue",
    "Layout",
    "Lease",
    "LeaseLost",
    "LeaseNotFound",
    "RangeResult",
    "Txn",
    "TxnConflict",
    "TxnResult",
    "apply_changes",
    "encode_broker",
    "encode_consumer",
    "encode_item",
]
