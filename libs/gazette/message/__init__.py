"""Messages: exactly-once semantics over at-least-once journals.

Journals are bytes; this package gives them messages. Each message carries a v1 UUID
(producer, clock, transaction flags); a `Publisher` sequences UUIDs per journal and writes
messages committed, or uncommitted within a transaction it later acknowledges; readers
decode frames (`read_uncommitted`) and a `Sequencer` keeps only committed messages, each
once (`read_committed`). Importing this package registers the framings
(``application/x-ndjson``, ``application/x-protobuf-fixed``, ``text/csv``).
"""

from gazette.message import framing as _framing  # noqa: F401 - registers framings
from gazette.message.adapters import message_type
from gazette.message.base import (
    Envelope,
    Frame,
    FrameError,
    Framing,
    Message,
    framing_for,
    register_framing,
)
from gazette.message.mapping import (
    NoPartitions,
    Partition,
    Partitions,
    StaticPartitions,
    fnv1a_32,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)
from gazette.message.publisher import (
    AckIntent,
    AppendClient,
    MemoryCommit,
    MemoryJournals,
    Publisher,
)
from gazette.message.reader import drain, read_committed, read_uncommitted
from gazette.message.sequencer import (
    PRUNE_HORIZON,
    ProducerState,
    ReplayRequired,
    Sequencer,
)
from gazette.message.types import (
    AtLeastOnce,
    CsvRecord,
    DataclassMessage,
    JsonMessage,
    ProtoMessage,
)
from gazette.message.uuid import Clock, Flags, ProducerId, new_producer_id

__all__ = [
    "PRUNE_HORIZON",
    "AckIntent",
    "AppendClient",
    "AtLeastOnce",
    "Clock",
    "CsvRecord",
    "DataclassMessage",
    "Envelope",
    "Flags",
    "Frame",
    "FrameError",
    "Framing",
    "JsonMessage",
    "MemoryCommit",
    "MemoryJournals",
    "Message",
    "NoPartitions",
    "Partition",
    "Partitions",
    "ProducerId",
    "ProducerState",
    "ProtoMessage",
    "Publisher",
    "ReplayRequired",
    "Sequencer",
    "StaticPartitions",
    "drain",
    "fnv1a_32",
    "framing_for",
    "message_type",
    "modulo_mapping",
    "new_producer_id",
    "random_mapping",
    "read_committed",
    "read_uncommitted",
    "register_framing",
    "rendezvous_mapping",
]
