"""etcd: the client, mirrored keyspaces, revision-guarded transactions and leases."""

from gazette.keyspace.etcd import Etcd, EtcdError, Event, KeyValue, RangeResult
from gazette.keyspace.keyspace import Entry, KeySpace
from gazette.keyspace.layout import Layout
from gazette.keyspace.lease import Lease, LeaseLost
from gazette.keyspace.txn import Txn, TxnConflict, TxnResult

__all__ = [
    "Entry",
    "Etcd",
    "EtcdError",
    "Event",
    "KeySpace",
    "KeyValue",
    "Layout",
    "Lease",
    "LeaseLost",
    "RangeResult",
    "Txn",
    "TxnConflict",
    "TxnResult",
]
