"""The client's side of the wire: broker addresses, channel options, and Append content
packed into large messages encoded without extra copies.

Per-message cost dominates gRPC throughput here (about 250 µs of the server's loop per
message; docs/DESIGN "Performance facts"), so content goes in messages of about
`MESSAGE_BYTES`. protobuf only takes `bytes`, so building an `AppendRequest` from a
slice of a larger buffer copies the slice, and serializing it copies it again; a content
message is instead encoded by hand (field 8's tag, a varint length, the pieces joined
once) straight from the caller's buffers and memoryviews.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from gazette.errors import ValidationError, short_repr
from gazette.pb import broker_pb2 as pb
from gazette.protocol.content import APPEND_CONTENT_FIELD, content_field

#: Content per Append message.
MESSAGE_BYTES = 1 << 20

#: Large messages both ways (appends and reads stream ~1 MiB chunks; a
#: ListFragments page of 10,000 signed URLs is several MiB); keepalive pings notice a
#: dead broker within about 40 s even on an idle stream (the broker permits them every
#: 5 s); reconnect quickly after a broker restart.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]

_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.%\w]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")
_PASS_THROUGH = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")


def parse_address(address: object) -> str:
    """The gRPC target of a broker address: ``host:port``, ``http://host:port``,
    ``grpc://host:port`` or their TLS spellings ``https://``, ``grpcs://`` (the scheme
    is dropped: TLS is the client's `ClientAuth`), or a gRPC target such as
    ``unix:/path`` or ``dns:///host:port`` as it is."""
    if not isinstance(address, str):
        raise ValidationError("address", f"expected host:port, got {short_repr(address)}")
    text = address.strip()
    if text.startswith(_PASS_THROUGH):
        if text.rstrip("/") in _PASS_THROUGH or text.endswith(":"):
            raise ValidationError("address", f"{address!r} names no socket or host")
        return text
    scheme, sep, rest = text.partition("://")
    if sep:
        if scheme not in ("http", "grpc", "https", "grpcs"):
            raise ValidationError("address", f"{address!r}: scheme {scheme!r} is not "
                                  "supported (use host:port, http:// or grpc://)")
        text = rest.rstrip("/")
    m = _HOST_PORT.match(text)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ValidationError("address", f"{address!r} is not host:port (e.g. "
                              "localhost:8080 or http://broker:8080)")
    return text


class Content:
    """One Append content message: `parts` (bytes or memoryviews) of `size` bytes."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list[bytes | memoryview], size: int) -> None:
        self.parts, self.size = parts, size


class WholeAppend:
    """An AppendWhole request: the metadata of `meta` and all of `content`."""

    __slots__ = ("content", "meta")

    def __init__(self, meta: pb.AppendRequest, content: Content) -> None:
        self.meta, self.content = meta, content


def encode_append(msg: Content | WholeAppend | pb.AppendRequest) -> bytes:
    """The request serializer of Append and AppendWhole calls: content encoded by hand
    (one copy of it), metadata by protobuf. A whole append is its metadata message
    followed by the content field: protobuf merges concatenated messages."""
    if isinstance(msg, Content):
        return b"".join(content_field(APPEND_CONTENT_FIELD, msg.parts, msg.size))
    if isinstance(msg, WholeAppend):
        return b"".join([msg.meta.SerializeToString(), *content_field(
            APPEND_CONTENT_FIELD, msg.content.parts, msg.content.size)])
    return msg.SerializeToString()


def as_view(chunk: object, field: str = "content") -> memoryview:
    """A flat byte view of `chunk`, or a ValidationError naming `field`."""
    if isinstance(chunk, str) or not isinstance(chunk, bytes | bytearray | memoryview):
        raise ValidationError(field, f"expected bytes, got {type(chunk).__name__}")
    view = memoryview(chunk)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class Packer:
    """Packs chunks of any size into `Content` messages of exactly `limit` bytes (the
    last one shorter): small chunks share a message, large ones are sliced (as views,
    not copies). Never yields an empty message, which would commit the append."""

    def __init__(self, limit: int = MESSAGE_BYTES) -> None:
        self.limit = limit
        self.total = 0
        self._parts: list[bytes | memoryview] = []
        self._size = 0

    def add(self, chunk: object) -> Iterator[Content]:
        """Messages completed by `chunk`."""
        view = as_view(chunk)
        n = len(view)
        self.total += n
        if n and not self._size and n <= self.limit and isinstance(chunk, bytes):
            if n == self.limit:
                yield Content([chunk], n)
            else:
                self._parts, self._size = [chunk], n
            return
        pos = 0
        while pos < n:
            take = min(n - pos, self.limit - self._size)
            self._parts.append(view[pos:pos + take])
            self._size += take
            pos += take
            if self._size == self.limit:
                yield self._flush()

    def _flush(self) -> Content:
        msg = Content(self._parts, self._size)
        self._parts, self._size = [], 0
        return msg

    def finish(self) -> Iterator[Content]:
        """The last, partial message (if any)."""
        if self._size:
            yield self._flush()


def pack(chunks: Iterable[object], limit: int = MESSAGE_BYTES) -> tuple[list[Content], int]:
    """All of `chunks` as messages, and their total size."""
    packer = Packer(limit)
    out: list[Content] = []
    for chunk in chunks:
        out.extend(packer.add(chunk))
    out.extend(packer.finish())
    return out, packer.total
