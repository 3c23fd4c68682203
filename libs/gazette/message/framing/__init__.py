"""Framings: how messages are delimited in a journal of each content type.

Importing this package registers (see `gazette.message.base.framing_for`):

- ``application/x-ndjson``: `NdjsonFraming`, one JSON document per line;
- ``application/x-protobuf-fixed``: `FixedProtoFraming`, protobuf messages behind an
  8-byte header (Gazette's magic word and a little-endian length);
- ``text/csv``: `CsvFraming`, one CSV record (RFC 4180) per message, UUID in column 0.

Each takes the options ``message_type`` (see `gazette.message.adapters.message_type`) and
``max_frame`` (the largest message in bytes, default 64 MiB), e.g.
``framing_for("application/x-ndjson", message_type=Click)``.
"""

from gazette.message.base import register_framing
from gazette.message.framing.csv import CsvFraming
from gazette.message.framing.fixed import FIXED_FRAME_MAGIC, FixedProtoFraming
from gazette.message.framing.ndjson import DEFAULT_MAX_FRAME, NdjsonFraming

register_framing(NdjsonFraming.content_type, NdjsonFraming)
register_framing(FixedProtoFraming.content_type, FixedProtoFraming)
register_framing(CsvFraming.content_type, CsvFraming)

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FIXED_FRAME_MAGIC",
    "CsvFraming",
    "FixedProtoFraming",
    "NdjsonFraming",
]
