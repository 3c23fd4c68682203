"""The protocol's statuses as Python enums: what a refusal carries from the replica that
makes it, through a forward and over the wire, to the client that reads it. Code matches
these members, never the text of a message (which a forward may have rewritten).

Members are `StrEnum`s named as the protocol's codes, so a status prints, logs and
compares as its name; `code` is the protocol's number.
"""

from __future__ import annotations

from enum import StrEnum

from gazette.pb import broker_pb2 as pb
from gazette.pb import consumer_pb2 as cpb


class Status(StrEnum):
    """Outcome of a Journal RPC (`gazette.broker.Status`)."""

    OK = "OK"
    JOURNAL_NOT_FOUND = "JOURNAL_NOT_FOUND"
    NO_JOURNAL_PRIMARY_BROKER = "NO_JOURNAL_PRIMARY_BROKER"
    NOT_JOURNAL_PRIMARY_BROKER = "NOT_JOURNAL_PRIMARY_BROKER"
    NOT_JOURNAL_BROKER = "NOT_JOURNAL_BROKER"
    INSUFFICIENT_JOURNAL_BROKERS = "INSUFFICIENT_JOURNAL_BROKERS"
    OFFSET_NOT_YET_AVAILABLE = "OFFSET_NOT_YET_AVAILABLE"
    WRONG_ROUTE = "WRONG_ROUTE"
    PROPOSAL_MISMATCH = "PROPOSAL_MISMATCH"
    ETCD_TRANSACTION_FAILED = "ETCD_TRANSACTION_FAILED"
    NOT_ALLOWED = "NOT_ALLOWED"
    WRONG_APPEND_OFFSET = "WRONG_APPEND_OFFSET"
    INDEX_HAS_GREATER_OFFSET = "INDEX_HAS_GREATER_OFFSET"
    REGISTER_MISMATCH = "REGISTER_MISMATCH"
    SUSPENDED = "SUSPENDED"
    FRAGMENT_STORE_UNHEALTHY = "FRAGMENT_STORE_UNHEALTHY"
    REPLICATION_FAILED = "REPLICATION_FAILED"
    APPEND_TOO_LARGE = "APPEND_TOO_LARGE"

    @property
    def code(self) -> pb.Status.ValueType:
        """The protocol's number of this status."""
        return pb.Status.Value(self.value)

    @classmethod
    def of(cls, code: int) -> Status:
        """The status of a response's `status` field (a number this build does not know
        is a `ValueError`)."""
        return cls(pb.Status.Name(code))  # type: ignore[arg-type]

    @property
    def route_changing(self) -> bool:
        """Whether the journal's route is changing (a broker died, joined or drains):
        nothing was written, and the same request may succeed in a moment. Clients
        retry these on their own."""
        return self in _ROUTE_CHANGING

    @property
    def retriable(self) -> bool:
        """Whether nothing was written and the same request is worth sending again
        later: a changing route, or a store that does not take fragments yet."""
        return self in _ROUTE_CHANGING or self is Status.FRAGMENT_STORE_UNHEALTHY


_ROUTE_CHANGING = frozenset({
    Status.NO_JOURNAL_PRIMARY_BROKER, Status.NOT_JOURNAL_PRIMARY_BROKER,
    Status.NOT_JOURNAL_BROKER, Status.INSUFFICIENT_JOURNAL_BROKERS, Status.WRONG_ROUTE,
    Status.REPLICATION_FAILED,
})


class ShardStatus(StrEnum):
    """Outcome of a Shard RPC (`gazette.consumer.Status`)."""

    OK = "OK"
    SHARD_NOT_FOUND = "SHARD_NOT_FOUND"
    NO_SHARD_PRIMARY = "NO_SHARD_PRIMARY"
    NOT_SHARD_PRIMARY = "NOT_SHARD_PRIMARY"
    ETCD_TRANSACTION_FAILED = "ETCD_TRANSACTION_FAILED"
    SHARD_STOPPED = "SHARD_STOPPED"

    @property
    def code(self) -> cpb.Status.ValueType:
        """The protocol's number of this status."""
        return cpb.Status.Value(self.value)

    @classmethod
    def of(cls, code: int) -> ShardStatus:
        """The status of a response's `status` field."""
        return cls(cpb.Status.Name(code))  # type: ignore[arg-type]

    @property
    def retriable(self) -> bool:
        """Whether the shard's route is changing: the request may succeed in a moment."""
        return self in (ShardStatus.NO_SHARD_PRIMARY, ShardStatus.NOT_SHARD_PRIMARY,
                        ShardStatus.SHARD_STOPPED)
