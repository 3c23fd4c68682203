"""The broker's data path as bytes: appends pipelined on one connection, answered in
order. Pure encoding (bytes in, frames out, no I/O): the broker's ``framed`` server and
`gazette.client.framed` carry it over TCP or TLS, beside gRPC (which stays the API: every
RPC is there, and every client can use it alone).

A connection opens with the client's `PREFACE` and a HELLO frame; the broker answers
READY or GOAWAY. Every frame is an 8-byte header (the body's length as u32, its kind as
u8, its flags as u8, two zero bytes; little-endian) and its body:

- HELLO (client): the caller's bearer token, UTF-8 (empty with authorization off).
- READY (broker): the largest body it takes (u32): larger appends go by gRPC.
- APPEND (client): the length of an ``AppendRequest`` (u32), the request (journal,
  expected offset, registers: gRPC's first Append message), the content's CRC-32
  (u32, zlib's), the content (not empty). With the flag `CHAINED`, only if the append
  before it on this connection committed: else FAILED (ABORTED, nothing written), so
  a client may have many appends in flight and still know they commit in order, or
  not after one that did not.
- APPENDED (broker): an ``AppendResponse`` (gRPC's), its commit without a SHA-1 of
  the content (the broker checked its CRC-32 instead, and hashes each byte once, into
  its fragment's SHA-1).
- FAILED (broker): an append ended as gRPC would end its call: the status code
  (u16, gRPC's numbering) and the detail, UTF-8. As for an AppendWhole call, a
  retryable code (UNAVAILABLE: a replication that failed after its proposal) leaves
  the append in doubt; ABORTED (a broken chain), DATA_LOSS (a bad CRC-32) and the
  refusals of a token or an argument wrote nothing.
- GOAWAY (broker): the connection ends (a malformed frame, a refused token,
  shutdown): code and detail as FAILED. Appends not answered yet may or may not have
  committed.

Each APPEND gets exactly one APPENDED or FAILED, in the order they were sent.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from gazette.errors import ValidationError
from gazette.pb import broker_pb2 as pb
from gazette.protocol.crc import crc32

#: What a client sends first: the protocol's name and version.
PREFACE = b"GAZETTE-FRAMES/1\r\n"
HEADER = struct.Struct("<IBB2x")
#: An APPEND's flag: served only if the append before it on the connection committed.
CHAINED = 0x01
_U32 = struct.Struct("<I")
_CODE = struct.Struct("<H")
#: The largest body a broker takes by default (READY says its own).
DEFAULT_MAX_BODY = 16 << 20
#: The most bytes of a HELLO's token, an APPEND's request or a refusal's detail.
MAX_META = 64 << 10


class Kind(enum.IntEnum):
    HELLO = 1
    READY = 2
    APPEND = 3
    APPENDED = 4
    FAILED = 5
    GOAWAY = 6


class FrameError(ValidationError):
    """A frame that breaks the protocol: the connection cannot go on."""


def header(kind: Kind, length: int, flags: int = 0) -> bytes:
    return HEADER.pack(length, kind, flags)


def parse_header(data: bytes | bytearray | memoryview, max_body: int
                 ) -> tuple[Kind, int, int]:
    """A frame header's kind, body length and flags; `FrameError` if any is unknown or
    out of bounds (checked before the body is read: a huge length allocates nothing)."""
    if len(data) != HEADER.size:
        raise FrameError("frame", f"a header is {HEADER.size} bytes, got {len(data)}")
    length, kind, flags = HEADER.unpack(data)
    if bytes(data[6:8]) != b"\0\0":
        raise FrameError("frame", "the header's reserved bytes are not zero")
    if flags & ~CHAINED or (flags and kind != Kind.APPEND):
        raise FrameError("frame.flags", f"unknown flags {flags:#x} for kind {kind}")
    try:
        known = Kind(kind)
    except ValueError:
        raise FrameError("frame.kind", f"unknown kind {kind}") from None
    if length > max_body:
        raise FrameError("frame.length", f"{length} bytes is over the {max_body}-byte limit")
    return known, length, flags


def hello(token: str) -> bytes:
    body = token.encode()
    if len(body) > MAX_META:
        raise ValidationError("token", f"{len(body)} bytes is over {MAX_META}")
    return PREFACE + header(Kind.HELLO, len(body)) + body


def parse_hello(body: bytes | memoryview) -> str:
    if len(body) > MAX_META:
        raise FrameError("hello", f"a token of {len(body)} bytes is over {MAX_META}")
    try:
        return bytes(body).decode()
    except UnicodeDecodeError:
        raise FrameError("hello", "the token is not UTF-8") from None


def ready(max_body: int) -> bytes:
    return header(Kind.READY, _U32.size) + _U32.pack(max_body)


def parse_ready(body: bytes | memoryview) -> int:
    if len(body) != _U32.size:
        raise FrameError("ready", f"expected {_U32.size} bytes, got {len(body)}")
    (max_body,) = _U32.unpack(body)
    return int(max_body)


def append_parts(request: pb.AppendRequest, content: list[bytes | bytearray | memoryview],
                 size: int, *, chained: bool = False) -> list[bytes | bytearray | memoryview]:
    """An APPEND frame as the buffers to write (the content's are not copied)."""
    meta = request.SerializeToString()
    crc = 0
    for part in content:
        crc = crc32(part, crc)
    length = _U32.size + len(meta) + _U32.size + size
    return [header(Kind.APPEND, length, CHAINED if chained else 0) + _U32.pack(len(meta))
            + meta + _U32.pack(crc),
            *content]


@dataclass(frozen=True, slots=True)
class Append:
    request: pb.AppendRequest
    content: memoryview
    crc: int
    chained: bool = False

    def check(self) -> None:
        """`FrameError`-free: a ValidationError naming the content if its CRC-32 does not
        match what the client summed (it changed on the way: nothing is appended)."""
        actual = crc32(self.content, 0)
        if actual != self.crc:
            raise ValidationError("content", f"its CRC-32 is {actual:08x}, the client "
                                  f"sent {self.crc:08x}: it changed on the way")


def parse_append(body: bytes | bytearray | memoryview, flags: int = 0) -> Append:
    view = memoryview(body)
    if len(view) < 2 * _U32.size:
        raise FrameError("append", f"a body of {len(view)} bytes is too short")
    (meta_len,) = _U32.unpack_from(view)
    if meta_len > MAX_META or _U32.size + meta_len + _U32.size > len(view):
        raise FrameError("append", f"a request of {meta_len} bytes does not fit the body")
    request = pb.AppendRequest()
    try:
        request.ParseFromString(bytes(view[_U32.size:_U32.size + meta_len]))
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise FrameError("append", "the request is not an AppendRequest") from None
    at = _U32.size + meta_len
    (crc,) = _U32.unpack_from(view, at)
    content = view[at + _U32.size:]
    if not content:
        raise FrameError("append", "no content: an append by frame carries some")
    return Append(request, content, crc, bool(flags & CHAINED))


def appended(response: pb.AppendResponse) -> bytes:
    body = response.SerializeToString()
    return header(Kind.APPENDED, len(body)) + body


def parse_appended(body: bytes | memoryview) -> pb.AppendResponse:
    response = pb.AppendResponse()
    try:
        response.ParseFromString(bytes(body))
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise FrameError("appended", "the body is not an AppendResponse") from None
    return response


def refusal(kind: Kind, code: int, detail: str) -> bytes:
    """A FAILED or GOAWAY frame (the detail cut to `MAX_META` bytes)."""
    text = detail.encode()[:MAX_META]
    return header(kind, _CODE.size + len(text)) + _CODE.pack(code) + text


def parse_refusal(body: bytes | memoryview) -> tuple[int, str]:
    if len(body) < _CODE.size or len(body) > _CODE.size + MAX_META:
        raise FrameError("refusal", f"a body of {len(body)} bytes")
    (code,) = _CODE.unpack_from(body)
    return int(code), bytes(body[_CODE.size:]).decode(errors="replace")
