"""Large `content` fields encoded and decoded beside protobuf, not through it.

Appends and reads carry up to a MiB of content per message. Through protobuf, content
is copied into the message, again when it is serialized, and again each time the field
is read. A content field is just a tag, a varint length and the bytes, and protobuf
merges concatenated messages, so content is instead written straight after the rest of
its message (one copy, by `bytes.join`) and, when reading, sliced out of the raw
message (one copy, or none where a view will do), with protobuf parsing only the small
rest.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from gazette.pb import broker_pb2 as pb

Buffer = bytes | bytearray | memoryview

#: Field numbers of the content fields (length-delimited, wire type 2).
APPEND_CONTENT_FIELD = 8
READ_CONTENT_FIELD = 7


def varint(n: int) -> bytes:
    """`n` (>= 0) as a protobuf varint."""
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def content_field(field: int, parts: Sequence[Buffer], size: int) -> list[Buffer]:
    """The pieces of a length-delimited `field` holding `parts` (`size` bytes in all),
    to be joined after the rest of a message."""
    return [varint(field << 3 | 2), varint(size), *parts]


def read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    """The varint at `raw[pos:]` and the position after it (DecodeError if truncated
    or overlong)."""
    value = shift = 0
    while True:
        if pos >= len(raw) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def field_span(raw: bytes, field: int) -> tuple[int, int, int]:
    """Where the length-delimited `field` is in message `raw`, as (its tag's offset, its
    content's begin, end); (len, len, len) if absent. For a field that occurs at most
    once at the top level."""
    pos, end = 0, len(raw)
    while pos < end:
        tag_at = pos
        key, pos = read_varint(raw, pos)
        wire = key & 7
        if wire == 0:
            _, pos = read_varint(raw, pos)
        elif wire == 2:
            length, pos = read_varint(raw, pos)
            if pos + length > end:
                raise DecodeError("a length-delimited field runs past the message")
            if key >> 3 == field:
                return tag_at, pos, pos + length
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")
    if pos != end:
        raise DecodeError("a fixed-width field runs past the message")
    return end, end, end


def _without(raw: bytes, tag_at: int, end: int) -> bytes:
    return raw[:tag_at] if end == len(raw) else raw[:tag_at] + raw[end:]


def split_field(raw: bytes, field: int) -> tuple[bytes, bytes]:
    """(`raw` without `field`, the content of `field`) (see `field_span`)."""
    tag_at, begin, end = field_span(raw, field)
    return _without(raw, tag_at, end), raw[begin:end]


class ReadContent:
    """A ReadResponse as its `meta` (every field but content) and its `content`."""

    __slots__ = ("content", "meta")

    def __init__(self, meta: pb.ReadResponse, content: bytes | bytearray = b"") -> None:
        self.meta, self.content = meta, content


def encode_read_response(msg: ReadContent | pb.ReadResponse | bytes) -> bytes:
    """The response serializer of Read: content joined after the rest (one copy); a
    response already serialized (forwarded from another broker) as it is."""
    if isinstance(msg, bytes):
        return msg
    if isinstance(msg, pb.ReadResponse):
        return msg.SerializeToString()
    if not msg.content:
        return msg.meta.SerializeToString()
    return b"".join([msg.meta.SerializeToString(),
                     *content_field(READ_CONTENT_FIELD, [msg.content], len(msg.content))])


def decode_read_response(raw: bytes) -> ReadContent:
    """The response deserializer of Read: content sliced out of `raw` (one copy),
    protobuf parsing the rest."""
    rest, content = split_field(raw, READ_CONTENT_FIELD)
    return ReadContent(pb.ReadResponse.FromString(rest), content)


class AppendContent:
    """An AppendRequest as its `meta` (every field but content) and its `content`, a
    view of the message received (not a copy)."""

    __slots__ = ("content", "meta")

    def __init__(self, meta: pb.AppendRequest, content: bytes | memoryview = b"") -> None:
        self.meta, self.content = meta, content


_NO_META = pb.AppendRequest()  # shared by content-only messages: never to be changed


def decode_append_request(raw: bytes) -> AppendContent:
    """The request deserializer of Append and AppendWhole: content is a view into `raw`
    (no copy: a broker only writes and hashes it); a content-only message (all but an
    Append's first) parses nothing."""
    tag_at, begin, end = field_span(raw, APPEND_CONTENT_FIELD)
    rest = _without(raw, tag_at, end)
    return AppendContent(pb.AppendRequest.FromString(rest) if rest else _NO_META,
                         memoryview(raw)[begin:end])


#: Field numbers of ReplicateRequest's content and content_delta.
REPLICATE_CONTENT_FIELD = 5
_REPLICATE_DELTA_TAG = varint(6 << 3)


def encode_replicate_content(content: Buffer, delta: int) -> bytes:
    """A ReplicateRequest carrying `content` at `content_delta`, serialized once (one
    copy) for every peer it is sent to."""
    return b"".join([_REPLICATE_DELTA_TAG, varint(delta),
                     *content_field(REPLICATE_CONTENT_FIELD, [content], len(content))])


def encode_replicate_request(msg: bytes | pb.ReplicateRequest) -> bytes:
    """The request serializer of Replicate: pre-serialized content passes as it is."""
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


class ReplicateContent:
    """A ReplicateRequest as its `meta` (every field but content) and its `content`, a
    view of the message received."""

    __slots__ = ("content", "meta")

    def __init__(self, meta: pb.ReplicateRequest, content: memoryview) -> None:
        self.meta, self.content = meta, content


def decode_replicate_request(raw: bytes) -> ReplicateContent:
    """The request deserializer of Replicate: content is a view into `raw`."""
    tag_at, begin, end = field_span(raw, REPLICATE_CONTENT_FIELD)
    rest = _without(raw, tag_at, end)
    return ReplicateContent(pb.ReplicateRequest.FromString(rest),
                            memoryview(raw)[begin:end])
