"""Protocol types: journal, shard and member specs, their validation, and conversions.

Everything here validates on construction: an invalid spec cannot exist, and every error
is a `ValidationError` naming the field and the reason.
"""

from gazette.protocol.convert import (
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
from gazette.protocol.durations import format_duration, parse_duration
from gazette.protocol.journal_spec import (
    CompressionCodec,
    FragmentSpec,
    JournalFlags,
    JournalSpec,
    Suspend,
    SuspendLevel,
    validate_store_url,
)
from gazette.protocol.member_spec import MemberSpec, ProcessId
from gazette.protocol.route import EMPTY_ROUTE, Route, route_from_pb
from gazette.protocol.shard_spec import ShardSource, ShardSpec

__all__ = [
    "EMPTY_ROUTE",
    "CompressionCodec",
    "FragmentSpec",
    "JournalFlags",
    "JournalSpec",
    "MemberSpec",
    "ProcessId",
    "Route",
    "ShardSource",
    "ShardSpec",
    "Suspend",
    "SuspendLevel",
    "broker_spec_from_pb",
    "broker_spec_to_pb",
    "consumer_spec_from_pb",
    "consumer_spec_to_pb",
    "format_duration",
    "journal_spec_from_pb",
    "journal_spec_to_pb",
    "labels_from_pb",
    "labels_to_pb",
    "parse_duration",
    "route_from_pb",
    "selector_from_pb",
    "selector_to_pb",
    "shard_spec_from_pb",
    "shard_spec_to_pb",
    "validate_store_url",
]
