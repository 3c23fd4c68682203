"""Protocol types: journal, shard and member specs, their validation, and conversions.

Everything here validates on construction: an invalid spec cannot exist, and every error
is a `ValidationError` naming the field and the reason.
"""

from gazette.protocol.content import (
    APPEND_CONTENT_FIELD,
    AppendContent,
    ReadContent,
    ReplicateContent,
    content_field,
    decode_append_request,
    decode_replicate_request,
    encode_read_response,
    encode_replicate_content,
    encode_replicate_request,
)
from gazette.protocol.convert import (
    broker_spec_from_pb,
    broker_spec_to_pb,
    consumer_spec_from_pb,
    consumer_spec_to_pb,
    duration_from_pb,
    journal_spec_from_pb,
    journal_spec_to_pb,
    labels_from_pb,
    labels_to_pb,
    selector_from_pb,
    selector_to_pb,
    shard_spec_from_pb,
    shard_spec_to_pb,
)
from gazette.protocol.durations import MAX_DURATION, format_duration, parse_duration
from gazette.protocol.fields import INT64_MAX
from gazette.protocol.journal_spec import (
    CompressionCodec,
    FragmentSpec,
    JournalFlags,
    JournalSpec,
    Suspend,
    SuspendLevel,
    validate_store_url,
)
from gazette.protocol.member_spec import MemberSpec, ProcessId, data_address
from gazette.protocol.replica_status import ReplicaState, ReplicaStatus, combined_status
from gazette.protocol.route import EMPTY_ROUTE, Route, route_from_pb
from gazette.protocol.shard_spec import ShardSource, ShardSpec
from gazette.protocol.status import ShardStatus, Status
from gazette.protocol.trees import SpecChange, journal_changes_from_yaml, specs_to_yaml

__all__ = [
    "APPEND_CONTENT_FIELD",
    "EMPTY_ROUTE",
    "INT64_MAX",
    "MAX_DURATION",
    "AppendContent",
    "CompressionCodec",
    "FragmentSpec",
    "JournalFlags",
    "JournalSpec",
    "MemberSpec",
    "ProcessId",
    "ReadContent",
    "ReplicaState",
    "ReplicaStatus",
    "ReplicateContent",
    "Route",
    "ShardSource",
    "ShardSpec",
    "ShardStatus",
    "SpecChange",
    "Status",
    "Suspend",
    "SuspendLevel",
    "broker_spec_from_pb",
    "broker_spec_to_pb",
    "combined_status",
    "consumer_spec_from_pb",
    "consumer_spec_to_pb",
    "content_field",
    "data_address",
    "decode_append_request",
    "decode_replicate_request",
    "duration_from_pb",
    "encode_read_response",
    "encode_replicate_content",
    "encode_replicate_request",
    "format_duration",
    "journal_changes_from_yaml",
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
    "specs_to_yaml",
    "validate_store_url",
]
