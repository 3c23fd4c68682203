"""The data path's frames (`gazette.protocol.frames`): what a client and a broker write
reads back the same, and malformed frames are refused naming what is wrong, before any
body is read."""

from __future__ import annotations

import zlib

import pytest

from gazette.errors import ValidationError
from gazette.pb import broker_pb2 as pb
from gazette.protocol import frames
from gazette.protocol.frames import FrameError, Kind


def body_of(frame: bytes) -> tuple[Kind, bytes]:
    kind, length, _ = frames.parse_header(frame[:frames.HEADER.size], 1 << 20)
    body = frame[frames.HEADER.size:]
    assert len(body) == length
    return kind, body


def test_an_append_reads_back_with_its_request_and_crc() -> None:
    request = pb.AppendRequest(journal="a/b", offset=42)
    parts = frames.append_parts(request, [b"hello ", memoryview(b"world\n")], 12)
    assert parts[1] == b"hello "  # the content's buffers are passed on, not copied
    kind, body = body_of(b"".join(bytes(p) for p in parts))
    assert kind is Kind.APPEND
    append = frames.parse_append(body)
    assert append.request.journal == "a/b" and append.request.offset == 42
    assert bytes(append.content) == b"hello world\n"
    assert append.crc == zlib.crc32(b"hello world\n")
    append.check()


def test_a_chained_append_says_so() -> None:
    parts = frames.append_parts(pb.AppendRequest(journal="a/b"), [b"x"], 1, chained=True)
    raw = b"".join(bytes(p) for p in parts)
    kind, _, flags = frames.parse_header(raw[:frames.HEADER.size], 1 << 20)
    assert (kind, flags) == (Kind.APPEND, frames.CHAINED)
    assert frames.parse_append(raw[frames.HEADER.size:], flags).chained
    assert not frames.parse_append(raw[frames.HEADER.size:]).chained


def test_content_changed_on_the_way_fails_its_check_naming_it() -> None:
    parts = frames.append_parts(pb.AppendRequest(journal="a/b"), [b"abc"], 3)
    raw = bytearray(b"".join(bytes(p) for p in parts))
    raw[-1] ^= 1
    append = frames.parse_append(bytes(raw[frames.HEADER.size:]))
    with pytest.raises(ValidationError, match="content: its CRC-32"):
        append.check()


def test_hello_ready_appended_and_refusals_round_trip() -> None:
    hello = frames.hello("tok.en")
    assert hello.startswith(frames.PREFACE)
    kind, body = body_of(hello[len(frames.PREFACE):])
    assert kind is Kind.HELLO and frames.parse_hello(body) == "tok.en"
    kind, body = body_of(frames.ready(1 << 20))
    assert kind is Kind.READY and frames.parse_ready(body) == 1 << 20
    response = pb.AppendResponse(status=pb.WRONG_APPEND_OFFSET, detail="no")
    kind, body = body_of(frames.appended(response))
    assert kind is Kind.APPENDED and frames.parse_appended(body) == response
    kind, body = body_of(frames.refusal(Kind.FAILED, 7, "denied ✓"))
    assert kind is Kind.FAILED and frames.parse_refusal(body) == (7, "denied ✓")


@pytest.mark.parametrize(("header", "field", "why"), [
    (frames.HEADER.pack(10, 99, 0), "frame.kind", "unknown kind 99"),
    (frames.HEADER.pack(1 << 30, Kind.APPEND, 0), "frame.length", "over the"),
    (frames.HEADER.pack(3, Kind.APPEND, 0)[:6] + b"\1\0", "frame", "reserved"),
    (frames.HEADER.pack(3, Kind.APPEND, 0x80), "frame.flags", "unknown flags 0x80"),
    (frames.HEADER.pack(3, Kind.HELLO, frames.CHAINED), "frame.flags", "unknown flags"),
    (b"\0" * 3, "frame", "8 bytes"),
])
def test_bad_headers_are_refused_before_a_body_is_read(header: bytes, field: str,
                                                       why: str) -> None:
    with pytest.raises(FrameError, match=why) as info:
        frames.parse_header(header, 1 << 20)
    assert info.value.field == field


@pytest.mark.parametrize(("body", "why"), [
    (b"\1\0", "too short"),
    ((1 << 20).to_bytes(4, "little") + b"\0" * 8, "does not fit"),
    ((3).to_bytes(4, "little") + b"\xff\xff\xff" + b"\0" * 4 + b"x", "not an AppendRequest"),
    ((0).to_bytes(4, "little") + b"\0" * 4, "no content"),
])
def test_malformed_appends_are_frame_errors(body: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        frames.parse_append(body)


def test_other_malformed_bodies_are_frame_errors() -> None:
    with pytest.raises(FrameError, match="not UTF-8"):
        frames.parse_hello(b"\xff")
    with pytest.raises(FrameError, match="expected 4 bytes"):
        frames.parse_ready(b"\0")
    with pytest.raises(FrameError, match="a body of 1 bytes"):
        frames.parse_refusal(b"\0")
    with pytest.raises(FrameError, match="not an AppendResponse"):
        frames.parse_appended(b"\xff\xff\xff")
    with pytest.raises(ValidationError, match="token"):
        frames.hello("x" * (frames.MAX_META + 1))
