"""Framings (`gazette.message.framing`): round trips, offsets, chunking, bad input, fuzz."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gazette.message.framing  # noqa: F401 - registers the framings
from gazette.errors import ValidationError
from gazette.message import uuid as uuids
from gazette.message.base import Envelope, Frame, Framing, framing_for
from gazette.message.framing import (
    FIXED_FRAME_MAGIC,
    CsvFraming,
    FixedProtoFraming,
    NdjsonFraming,
)
from gazette.message.reader import read_uncommitted
from gazette.message.types import (
    NO_ACKNOWLEDGEMENT,
    AtLeastOnce,
    CsvRecord,
    JsonMessage,
    ProtoMessage,
)
from gazette.pb import broker_pb2
from tests.unit.message.test_types import (
    V1,
    V4,
    BytesEvent,
    Click,
    Event,
    Order,
    Point,
    TextEvent,
    new_uuid,
)

NDJSON, FIXED, CSV = "application/x-ndjson", "application/x-protobuf-fixed", "text/csv"
FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def with_uuid(msg: Any, flags: int = uuids.Flags.CONTINUE_TXN) -> Any:
    msg.set_uuid(new_uuid(flags))
    return msg


def check_ranges(frames: list[Frame], consumed: int, data: bytes) -> None:
    """Frames are in order, do not overlap, lie within the consumed bytes, and each has
    either a message or an error."""
    assert 0 <= consumed <= len(data)
    last = 0
    for f in frames:
        assert last <= f.begin < f.end <= consumed, (f, last, consumed)
        assert (f.message is None) != (f.error is None), f
        last = f.end


def decode_in_chunks(framing: Framing, data: bytes, cuts: list[int]) -> list[Frame]:
    """Decode `data` fed in pieces (cut at `cuts`), as a reader does: unconsumed bytes are
    carried over, and the last call is final. Offsets are made absolute."""
    frames: list[Frame] = []
    base, buf, pos = 0, b"", 0
    for cut in [*sorted(set(cuts)), len(data)]:
        buf += data[pos:cut]
        pos = cut
        final = pos == len(data)
        got, consumed = framing.decode(buf, final)
        check_ranges(got, consumed, buf)
        frames += [Frame(base + f.begin, base + f.end, f.message, f.error) for f in got]
        base += consumed
        buf = buf[consumed:]
        if final:
            break
    assert base == len(data) and not buf
    return frames


def good_frames(frames: list[Frame]) -> list[tuple[int, int, Any]]:
    return [(f.begin, f.end, f.message) for f in frames if f.error is None]


def covered(frames: list[Frame], errors: bool) -> set[int]:
    return {i for f in frames if (f.error is not None) == errors for i in range(f.begin, f.end)}


# -- registry --------------------------------------------------------------------------

def test_registered_on_import() -> None:
    assert isinstance(framing_for(NDJSON), NdjsonFraming)
    assert isinstance(framing_for(FIXED), FixedProtoFraming)
    assert isinstance(framing_for(CSV), CsvFraming)
    f = framing_for(NDJSON, message_type=Click, max_frame=100)
    assert isinstance(f, NdjsonFraming) and f.max_frame == 100
    assert f.content_type == NDJSON
    with pytest.raises(ValidationError, match="no framing for 'text/plain'") as err:
        framing_for("text/plain")
    assert err.value.field == "content-type"
    for bad in (0, -1, "1", True):
        with pytest.raises(ValidationError, match="max_frame"):
            framing_for(NDJSON, max_frame=bad)
    with pytest.raises(ValidationError, match="AtLeastOnce"):
        framing_for(CSV, message_type=Point)
    with pytest.raises(ValidationError, match="protobuf"):
        framing_for(FIXED, message_type=JsonMessage)
    with pytest.raises(ValidationError, match="message_type=MyMessage"):
        framing_for(FIXED).decode(b"")


# -- round trips -----------------------------------------------------------------------

def _click() -> Click:
    return with_uuid(Click("bob, \"the\" builder\nof things", 3))


ROUND_TRIPS: list[tuple[str, Any, Callable[[], list[Any]]]] = [
    (NDJSON, JsonMessage, lambda: [with_uuid(JsonMessage(a=1, b="x\ny", c=[None, 1.5])),
                                   JsonMessage(no="uuid")]),
    (NDJSON, Click, lambda: [_click(), Click()]),
    (NDJSON, Order, lambda: [with_uuid(Order("pen", 2))]),
    (NDJSON, Event, lambda: [with_uuid(Event(name="é", n=-1)), Event(name="")]),
    (NDJSON, TextEvent, lambda: [with_uuid(ProtoMessage(TextEvent(name="a", n=1 << 40)))]),
    (NDJSON, AtLeastOnce[Point], lambda: [AtLeastOnce(Point(1, 2))]),
    (NDJSON, AtLeastOnce[list[int]], lambda: [AtLeastOnce([1, 2]), AtLeastOnce([])]),
    (NDJSON, AtLeastOnce, lambda: [AtLeastOnce("text"), AtLeastOnce(None), AtLeastOnce(3)]),
    (FIXED, TextEvent, lambda: [with_uuid(ProtoMessage(TextEvent(name="a", n=5))),
                                ProtoMessage(TextEvent())]),
    (FIXED, BytesEvent, lambda: [with_uuid(ProtoMessage(BytesEvent(name="b")))]),
    (FIXED, broker_pb2.Label, lambda: [ProtoMessage(broker_pb2.Label(name="n", value="v"))]),
    (FIXED, AtLeastOnce[broker_pb2.Label], lambda: [AtLeastOnce(broker_pb2.Label(name="n"))]),
    (CSV, CsvRecord, lambda: [with_uuid(CsvRecord(["", "a,b", 'q"\r\nz', ""])),
                              CsvRecord(["", "no uuid"])]),
    (CSV, Click, lambda: [_click(), Click(count=-4)]),
    (CSV, Event, lambda: [with_uuid(Event(name="x,y", n=7))]),
    (CSV, AtLeastOnce[list[str]], lambda: [AtLeastOnce(["a", "b"])]),
]


@pytest.mark.parametrize(("content_type", "cls", "make"), ROUND_TRIPS,
                         ids=lambda v: getattr(v, "__name__", str(v))[:30])
def test_round_trip(content_type: str, cls: Any, make: Callable[[], list[Any]]) -> None:
    framing = framing_for(content_type, message_type=cls)
    messages = make()
    data = framing.encode(messages)
    frames, consumed = framing.decode(data)
    assert consumed == len(data)
    assert [f.error for f in frames] == [None] * len(messages)
    assert [f.message for f in frames] == messages
    assert [type(f.message) for f in frames] == [type(m) for m in messages]
    for frame, message in zip(frames, messages, strict=True):
        assert data[frame.begin:frame.end] == framing.encode([message])
        assert frame.message.get_uuid() == message.get_uuid()
    assert frames[0].begin == 0 and all(a.end == b.begin for a, b in pairwise(frames))

    # Acknowledgements round-trip too, and carry their ACK UUID.
    ack = messages[0].new_acknowledgement("a/journal")
    ack_uuid = new_uuid(uuids.Flags.ACK_TXN)
    ack.set_uuid(ack_uuid)
    encoded = framing.encode([ack])
    if ack is NO_ACKNOWLEDGEMENT:
        assert encoded == b""
        return
    (frame,), _ = framing.decode(encoded)
    assert frame.error is None and frame.message.get_uuid() == ack_uuid


@pytest.mark.parametrize("content_type", [NDJSON, FIXED, CSV])
def test_no_acknowledgement_encodes_to_nothing(content_type: str) -> None:
    framing = framing_for(content_type)
    assert framing.encode([NO_ACKNOWLEDGEMENT]) == b""
    assert framing.encode([]) == b""


def test_ndjson_encodes_any_message_type() -> None:
    """encode() goes by each message's own type, whatever the framing's message_type."""
    framing = NdjsonFraming()
    data = framing.encode([_click(), with_uuid(Event(name="e")),
                           ProtoMessage(TextEvent(name="t")), AtLeastOnce(Point(1, 2))])
    frames, _ = framing.decode(data)
    assert [f.message["name" if i in (1, 2) else "x" if i == 3 else "user"]
            for i, f in enumerate(frames)] == ["bob, \"the\" builder\nof things", "e", "t", 1]


def test_encode_errors() -> None:
    with pytest.raises(ValidationError, match="cannot be encoded as JSON") as err:
        NdjsonFraming().encode([JsonMessage(), JsonMessage(x=object())])
    assert err.value.field == "messages[1]"
    with pytest.raises(ValidationError, match="above max_frame") as err:
        NdjsonFraming(max_frame=20).encode([JsonMessage(a=1), JsonMessage(a="x" * 30)])
    assert err.value.field == "messages[1]"
    with pytest.raises(ValidationError, match="expected a protobuf message") as err:
        FixedProtoFraming().encode([ProtoMessage(TextEvent()), JsonMessage()])
    assert err.value.field == "messages[1]"
    with pytest.raises(ValidationError, match="above max_frame"):
        FixedProtoFraming(max_frame=3).encode([TextEvent(name="long name")])
    with pytest.raises(ValidationError, match="empty record") as err:
        CsvFraming().encode([CsvRecord(["a"]), CsvRecord()])
    assert err.value.field == "messages[1]"
    with pytest.raises(ValidationError, match="cannot be written as a CSV record"):
        CsvFraming().encode([AtLeastOnce("text")])
    with pytest.raises(ValidationError, match="above max_frame"):
        CsvFraming(max_frame=5).encode([CsvRecord(["123456"])])


# -- offsets and chunking --------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6)
json_messages = st.builds(
    lambda d, u: JsonMessage(d, uuid=uuids.to_str(new_uuid())) if u else JsonMessage(d),
    st.dictionaries(st.text(max_size=6).filter(lambda k: k != "uuid"), json_values, max_size=4),
    st.booleans())
csv_records = st.builds(
    lambda fields, u: CsvRecord([uuids.to_str(new_uuid()) if u else "", *fields]),
    st.lists(st.text(st.characters(exclude_categories=["Cs"]), max_size=8), max_size=4),
    st.booleans())
protos = st.builds(
    lambda name, n, u: with_uuid(ProtoMessage(TextEvent(name=name, n=n))) if u
    else ProtoMessage(TextEvent(name=name, n=n)),
    st.text(max_size=20), st.integers(-(2**63), 2**63 - 1), st.booleans())


@FAST
@given(st.lists(json_messages, max_size=12), st.data())
def test_ndjson_offsets_and_chunks(messages: list[JsonMessage], data: st.DataObject) -> None:
    framing = NdjsonFraming()
    encoded = framing.encode(messages)
    frames, consumed = framing.decode(encoded)
    assert consumed == len(encoded)
    assert [f.message for f in frames] == messages
    for frame, message in zip(frames, messages, strict=True):
        assert encoded[frame.begin:frame.end] == framing.encode([message])
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=8))
    assert decode_in_chunks(framing, encoded, cuts) == frames


bad_lines = st.sampled_from([
    b"not json\n", b"[1, 2]\n", b'"text"\n', b"{\n", b"}\n", b"{}{}\n", b"\n", b"  \t\r\n",
    b'{"uuid": "%s"}\n' % V4.encode(), b'{"uuid": 5}\n', b"\xff\xfe\n", b'{"a": "\xff"}\n',
])


@FAST
@given(st.lists(st.one_of(json_messages, bad_lines), max_size=12), st.data())
def test_ndjson_bad_lines_chunked(items: list[Any], data: st.DataObject) -> None:
    framing = NdjsonFraming()
    encoded = b"".join(i if isinstance(i, bytes) else framing.encode([i]) for i in items)
    whole, consumed = framing.decode(encoded, final=True)
    check_ranges(whole, consumed, encoded)
    good = [i for i in items if not isinstance(i, bytes)]
    assert [f.message for f in whole if f.error is None] == good
    blank = sum(1 for i in items if isinstance(i, bytes) and not i.strip())
    assert len(whole) == len(items) - blank
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=8))
    assert decode_in_chunks(framing, encoded, cuts) == whole


class _FramesOnly:
    """A framing without the `decode_envelopes` fast path: readers decode frames."""

    def __init__(self, framing: Framing) -> None:
        self.content_type, self.decode, self.encode = (
            framing.content_type, framing.decode, framing.encode)


other_uuid_lines = st.sampled_from([
    b'{"uuid": "%s"}\n' % V1.upper().encode(), b'{"uuid": "{%s}"}\n' % V1.encode(),
    b'{"uuid": "%s"}\n' % V1.replace("-", "").encode(), b'{"uuid": null}\n',
    b'{"uuid": ""}\n'])


@FAST
@given(st.lists(st.one_of(json_messages, bad_lines, other_uuid_lines), max_size=12),
       st.data())
def test_ndjson_envelope_fast_path_reads_what_frames_read(items: list[Any],
                                                          data: st.DataObject) -> None:
    """read_uncommitted's fast path (envelopes straight from NdjsonFraming, UUIDs
    converted in one batch) gives the envelopes, errors and UUIDs of the frame path,
    over bad lines, other UUID spellings and any chunking."""
    framing = NdjsonFraming()
    encoded = b"".join(i if isinstance(i, bytes) else framing.encode([i]) for i in items)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(encoded)), max_size=6))))
    offset = data.draw(st.integers(0, 1 << 40))

    async def read(f: Any) -> tuple[list[Envelope], list[tuple[int, int]]]:
        errors: list[tuple[int, int]] = []

        async def chunks() -> AsyncIterator[bytes]:
            for a, b in pairwise([0, *cuts, len(encoded)]):
                yield encoded[a:b]

        envs = [e async for batch in read_uncommitted(
            "j", chunks(), f, offset, lambda err: errors.append((err.begin, err.end)))
            for e in batch]
        return envs, errors

    fast, slow = asyncio.run(read(framing)), asyncio.run(read(_FramesOnly(framing)))
    assert fast == slow
    assert [e.uuid for e in fast[0]] == [e.message.get_uuid() or 0 for e in fast[0]]


@FAST
@given(st.lists(protos, max_size=10), st.lists(st.binary(max_size=12), max_size=10), st.data())
def test_fixed_offsets_and_chunks(messages: list[Any], junk: list[bytes],
                                  data: st.DataObject) -> None:
    framing = FixedProtoFraming(TextEvent)
    encoded = framing.encode(messages)
    frames, consumed = framing.decode(encoded)
    assert consumed == len(encoded) and [f.message for f in frames] == messages
    for frame, message in zip(frames, messages, strict=True):
        assert encoded[frame.begin:frame.end] == framing.encode([message])
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=8))
    assert decode_in_chunks(framing, encoded, cuts) == frames

    # Junk between frames: one big decode and a chunked one find the same frames, and
    # report the same bytes as skipped (maybe as more, smaller error frames).
    stream = b"".join(j + framing.encode([m]) for j, m in zip(junk, messages, strict=False))
    stream += b"".join(junk[len(messages):])
    whole, consumed = framing.decode(stream, final=True)
    check_ranges(whole, consumed, stream)
    assert consumed == len(stream)
    chunked = decode_in_chunks(framing, stream, data.draw(
        st.lists(st.integers(0, len(stream)), max_size=8)))
    assert good_frames(chunked) == good_frames(whole)
    assert covered(chunked, errors=True) == covered(whole, errors=True)


@FAST
@given(st.lists(csv_records, max_size=10), st.data())
def test_csv_offsets_and_chunks(records: list[CsvRecord], data: st.DataObject) -> None:
    framing = CsvFraming()
    encoded = framing.encode(records)
    frames, consumed = framing.decode(encoded)
    assert consumed == len(encoded)
    assert [f.message for f in frames] == records and [f.error for f in frames] == [
        None] * len(records)
    for frame, record in zip(frames, records, strict=True):
        assert encoded[frame.begin:frame.end] == framing.encode([record])
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=8))
    assert decode_in_chunks(framing, encoded, cuts) == frames


bad_csv = st.sampled_from([
    b'a"b",c\r\n', b'"a"b\r\n', V4.encode() + b",x\r\n", b"not-a-uuid\n", b"\r\n", b"\n",
    b"\xff\xfe,x\n", b'"multi\nline"x\n', b"a\rb\n",
])


@FAST
@given(st.lists(st.one_of(csv_records, bad_csv), max_size=10), st.data())
def test_csv_bad_records_chunked(items: list[Any], data: st.DataObject) -> None:
    framing = CsvFraming()
    encoded = b"".join(i if isinstance(i, bytes) else framing.encode([i]) for i in items)
    whole, consumed = framing.decode(encoded, final=True)
    check_ranges(whole, consumed, encoded)
    good = [i for i in items if not isinstance(i, bytes)]
    assert [f.message for f in whole if f.error is None] == good
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=8))
    assert decode_in_chunks(framing, encoded, cuts) == whole


# -- bad input, case by case -----------------------------------------------------------

def _ndjson_line(**fields: Any) -> bytes:
    return NdjsonFraming().encode([JsonMessage(fields)])


def test_ndjson_bad_lines_are_error_frames() -> None:
    good = _ndjson_line(uuid=V1, a=1)
    data = (good + b"garbage\n" + b"[1]\n" + _ndjson_line(uuid=V4) + b"\n" + b'{"uuid":"x"}\n'
            + good)
    frames, consumed = NdjsonFraming().decode(data)
    assert consumed == len(data)
    assert [(data[f.begin:f.end], f.error is None) for f in frames] == [
        (good, True), (b"garbage\n", False), (b"[1]\n", False),
        (_ndjson_line(uuid=V4), False), (b'{"uuid":"x"}\n', False), (good, True)]
    errors = [f.error for f in frames if f.error]
    assert errors[0].startswith("invalid JSON")
    assert "Expected `object`, got `array`" in errors[1]
    assert "is not a version 1 (RFC 4122) UUID: version 4" in errors[2]
    assert "'x' is not a UUID" in errors[3]


def test_ndjson_partial_and_final_lines() -> None:
    framing = NdjsonFraming()
    good = _ndjson_line(uuid=V1)
    frames, consumed = framing.decode(good + good[:10])
    assert consumed == len(good) and len(frames) == 1
    frames, consumed = framing.decode(good[:10])
    assert (frames, consumed) == ([], 0)
    frames, consumed = framing.decode(good + good[:-1], final=True)
    assert consumed == 2 * len(good) - 1
    assert [f.message for f in frames] == [JsonMessage(uuid=V1)] * 2
    assert frames[1].end == consumed
    frames, consumed = framing.decode(good + good[:10], final=True)
    assert consumed == len(good) + 10 and frames[1].error == (
        "invalid JSON: Input data was truncated")
    assert framing.decode(b"") == ([], 0) and framing.decode(b"", final=True) == ([], 0)


def test_ndjson_max_frame() -> None:
    framing = NdjsonFraming(max_frame=30)
    good = _ndjson_line(a=1)
    big = _ndjson_line(a="x" * 40)
    frames, consumed = framing.decode(good + big + good)
    assert consumed == 2 * len(good) + len(big)
    assert [f.message for f in frames] == [{"a": 1}, None, {"a": 1}]
    assert frames[1].error == f"line of {len(big) - 1} bytes is longer than max_frame (30)"
    assert (frames[1].begin, frames[1].end) == (len(good), len(good) + len(big))
    # Exactly max_frame bytes (without the newline) is fine.
    exact = _ndjson_line(a="x" * 22)
    assert len(exact) == 31 and framing.decode(exact)[0][0].error is None
    # A line that has not ended yet but is already too long is skipped as it comes.
    frames, consumed = framing.decode(good + b'{"a":"' + b"x" * 40)
    assert consumed == len(good) + 46 and frames[1].error is not None
    assert "longer than max_frame" in frames[1].error
    frames, consumed = framing.decode(good + b'{"a":"' + b"x" * 20)
    assert consumed == len(good) and len(frames) == 1


def _fixed(*messages: Any) -> bytes:
    return FixedProtoFraming().encode(list(messages))


def test_fixed_desync_is_skipped_to_next_frame() -> None:
    framing = FixedProtoFraming(TextEvent)
    a = _fixed(with_uuid(ProtoMessage(TextEvent(name="a"))))
    b = _fixed(ProtoMessage(TextEvent(name="b")))
    assert a[:4] == FIXED_FRAME_MAGIC == b"\x66\x33\x93\x36"
    data = a + b"garbage!" + b + b"\x00" * 3 + a
    frames, consumed = framing.decode(data)
    assert consumed == len(data)
    assert [(f.begin, f.end) for f in frames] == [
        (0, len(a)), (len(a), len(a) + 8), (len(a) + 8, len(a) + 8 + len(b)),
        (len(a) + 8 + len(b), len(a) + 11 + len(b)), (len(a) + 11 + len(b), len(data))]
    assert frames[1].error == (
        "skipped 8 bytes to the next frame (de-synchronized: no frame header here)")
    assert frames[3].error is not None and frames[3].error.startswith("skipped 3 bytes")
    assert [f.message.proto.name for f in frames if f.error is None] == ["a", "b", "a"]


def test_fixed_desync_without_next_frame_keeps_a_possible_magic_prefix() -> None:
    framing = FixedProtoFraming(TextEvent)
    frames, consumed = framing.decode(b"junk junk" + FIXED_FRAME_MAGIC[:3])
    assert consumed == 9 and frames[0].error is not None
    assert frames[0].error.startswith("skipped 9 bytes")
    frames, consumed = framing.decode(b"ju")
    assert (frames, consumed) == ([], 0)
    frames, consumed = framing.decode(b"ju", final=True)
    assert consumed == 2 and frames[0].error is not None


def test_fixed_incomplete_truncated_oversized_and_invalid() -> None:
    framing = FixedProtoFraming(TextEvent, max_frame=50)
    a = _fixed(TextEvent(name="a"))
    # Incomplete: left unconsumed; at the end (final): an error frame.
    for cut in (2, 6, len(a) - 1):
        assert framing.decode(a + a[:cut]) == ([Frame(0, len(a), ProtoMessage(
            TextEvent(name="a")))], len(a))
        frames, consumed = framing.decode(a + a[:cut], final=True)
        assert consumed == len(a) + cut and frames[1].error is not None
        assert "truncated" in frames[1].error or "skipped" in frames[1].error
    # Larger than max_frame: error, skip to the next magic word, go on.
    big = FixedProtoFraming().encode([TextEvent(name="x" * 60)])
    data = a + big + a
    frames, consumed = framing.decode(data)
    assert consumed == len(data)
    assert [f.error is None for f in frames] == [True, False, True]
    assert frames[1].error is not None and frames[1].error.startswith(
        f"frame of {len(big) - 8} bytes is larger than max_frame (50)")
    assert (frames[1].begin, frames[1].end) == (len(a), len(a) + len(big))
    # Not a valid message: an error frame, and decoding goes on after it.
    bad = FIXED_FRAME_MAGIC + (3).to_bytes(4, "little") + b"\xff\xff\xff"
    frames, consumed = framing.decode(bad + a)
    assert consumed == len(bad) + len(a)
    assert frames[0].error is not None and "not a valid gazette.test.TextEvent" in frames[0].error
    assert frames[1].message == ProtoMessage(TextEvent(name="a"))
    # A v4 UUID is an error too.
    v4 = _fixed(TextEvent(uuid=V4))
    assert "version 4" in (framing.decode(v4)[0][0].error or "")


def test_csv_bad_records_are_error_frames() -> None:
    framing = CsvFraming()
    good = framing.encode([CsvRecord([V1, "a"])])
    quote = V1.encode() + b',x"y,z\r\n'
    data = good + quote + V4.encode() + b",b\r\n" + b"\r\n" + good + b"\xff,x\n" + good
    frames, consumed = framing.decode(data)
    assert consumed == len(data)
    assert [(data[f.begin:f.end], f.error is None) for f in frames] == [
        (good, True), (quote, True), (V4.encode() + b",b\r\n", False),
        (good, True), (b"\xff,x\n", False), (good, True)]
    assert frames[1].message == [V1, 'x"y', "z"]  # a quote inside an unquoted field is data
    assert frames[2].error is not None and "version 4" in frames[2].error
    assert frames[4].error == "invalid CSV: not UTF-8 text"
    frames, _ = framing.decode(b'"a"b,c\n' + good)
    assert frames[0].error is not None and frames[0].error.startswith("invalid CSV")
    assert frames[1].message == [V1, "a"]


def test_csv_quoted_newlines_and_incomplete_records() -> None:
    framing = CsvFraming()
    record = CsvRecord([V1, "line 1\nline 2\r\nline 3", "x"])
    data = framing.encode([record])
    assert data.count(b"\n") == 3
    assert framing.decode(data) == ([Frame(0, len(data), record)], len(data))
    # Cut inside the quoted field: nothing yet, whatever newlines came.
    for cut in range(len(data)):
        assert framing.decode(data[:cut]) == ([], 0)
    frames, consumed = framing.decode(data[:-6], final=True)
    assert consumed == len(data) - 6 and frames[0].error is not None
    assert "quoted field is not closed" in frames[0].error
    # A last line without its line ending is a record when final.
    frames, consumed = framing.decode(V1.encode() + b",last", final=True)
    assert frames[0].message == [V1, "last"] and consumed == 41


def test_csv_max_frame() -> None:
    framing = CsvFraming(max_frame=60)
    good = framing.encode([CsvRecord([V1, "a"])])
    big = CsvFraming().encode([CsvRecord(["", "x" * 70])])
    frames, consumed = framing.decode(good + big + good)
    assert consumed == len(good) * 2 + len(big)
    assert [f.error is None for f in frames] == [True, False, True]
    assert frames[1].error == "record longer than max_frame (60 bytes)"
    # A quoted record spanning lines, too long before it ends: skipped as it comes.
    frames, consumed = framing.decode(good + b'"' + b"y\n" * 40)
    assert consumed == len(good) + 81 and frames[-1].error is not None


def test_csv_dataclass_columns() -> None:
    framing = CsvFraming(message_type=Click)
    frames, _ = framing.decode(b",bob,12\r\n,ann,nope\r\n,a,1,extra\r\n")
    assert frames[0].message == Click("bob", 12)
    assert frames[1].error is not None and "Expected `int`" in frames[1].error
    assert frames[2].error is not None and "4 columns" in frames[2].error


def test_pydantic_invalid_is_an_error_frame() -> None:
    framing = NdjsonFraming(message_type=Event)
    frames, _ = framing.decode(b'{"n": 1}\n{"name": "ok"}\n')
    assert frames[0].error == "invalid message: name: Field required"
    assert frames[1].message == Event(name="ok")


# -- fuzz ------------------------------------------------------------------------------

FRAMINGS: list[Callable[[], Framing]] = [
    lambda: NdjsonFraming(max_frame=64),
    lambda: NdjsonFraming(message_type=Click, max_frame=64),
    lambda: FixedProtoFraming(TextEvent, max_frame=64),
    lambda: FixedProtoFraming(AtLeastOnce[broker_pb2.Label], max_frame=64),
    lambda: CsvFraming(max_frame=64),
    lambda: CsvFraming(message_type=Event, max_frame=64),
]

pieces = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"\n", b"\r\n", b'"', b",", b"{", b"}", FIXED_FRAME_MAGIC,
                     FIXED_FRAME_MAGIC + b"\x02\x00\x00\x00\x08\x01", V1.encode(), V4.encode(),
                     b'{"uuid":"%s"}\n' % V1.encode()]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(FRAMINGS) - 1), st.lists(pieces, max_size=12), st.booleans())
def test_decode_fuzz(which: int, parts: list[bytes], final: bool) -> None:
    framing = FRAMINGS[which]()
    data = b"".join(parts)
    frames, consumed = framing.decode(data, final)
    check_ranges(frames, consumed, data)
    if final:
        assert consumed == len(data)
    for f in frames:
        if f.error is None:
            f.message.get_uuid()  # decoded messages carry a valid UUID (or none)
