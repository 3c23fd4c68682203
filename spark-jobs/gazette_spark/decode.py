"""Journal bytes to rows: one decoder per framing, a block of frames at a time.

A decoder is fed a journal's content in order (`feed`) and ends with `finish` (at the end
of what is read, or before a hole); it carries a frame cut by a chunk boundary over to the
next chunk. Each call returns `Block`s: the frames' offsets and values as arrays, and their
UUIDs by the column (see `uuids`), so the reader filters and converts whole blocks.

- ``lines``: every line is a row (``\\n`` ends it, a ``\\r`` before it is dropped, as
  ``spark.read.text`` does), found by numpy; no UUIDs.
- ``json``: one JSON document per line, as the message library's ndjson framing reads
  them (blank lines are no message); the UUID and, with a schema, the ``data`` column are
  parsed by Arrow's JSON reader; a block it cannot read exactly as the library would
  (a bad line, an odd UUID spelling) is decoded line by line by the library itself.
- ``csv`` and ``fixed``: the library's framings, frame by frame.

Frames that cannot be decoded are skipped and counted (`Decoder.bad_frames`), as the
message library's readers do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from gazette.message import Frame, framing_for
from gazette.names import load_attr
from gazette_spark.uuids import UuidColumns, from_ints, parse_text_column, text_of

log = logging.getLogger(__name__)

#: Content decoded at a time (bigger blocks: fewer, cheaper numpy and Arrow calls).
BLOCK = 8 << 20
_NL, _CR = 10, 13


@dataclass
class Block:
    """Frames of one journal: ``[begins[i], ends[i])`` holds `values[i]`."""

    begins: np.ndarray  # int64
    ends: np.ndarray  # int64
    values: pa.Array
    uuid_text: pa.Array | None = None
    uuids: UuidColumns | None = None
    data: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.begins)


class Decoder:
    """Base: buffering of a frame cut across chunks, and bad-frame counting."""

    def __init__(self, journal: str) -> None:
        self.journal = journal
        self.bad_frames = 0
        self._parts: list[bytes] = []
        self._size = 0
        self._base = -1  # journal offset of the first buffered byte

    def feed(self, chunk: bytes, offset: int) -> list[Block]:
        """Decode `chunk`, the journal's bytes at `offset` (right after the last)."""
        if self._base < 0:
            self._base = offset
        self._parts.append(chunk)
        self._size += len(chunk)
        if self._size < BLOCK:
            return []
        return self._decode(final=False)

    def finish(self) -> list[Block]:
        """Decode what is buffered as the end of the content (a partial frame at the end
        is a frame of its own, or a bad one)."""
        if not self._size:
            self._parts, self._base = [], -1
            return []
        out = self._decode(final=True)
        self._parts, self._size, self._base = [], 0, -1
        return out

    def _decode(self, final: bool) -> list[Block]:
        data = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        blocks, used = self.decode(data, self._base, final)
        rest = data[used:]
        self._parts = [rest] if rest else []
        self._size, self._base = len(rest), self._base + used
        return [b for b in blocks if len(b)]

    def decode(self, data: bytes, base: int, final: bool) -> tuple[list[Block], int]:
        raise NotImplementedError

    def _bad(self, begin: int, end: int, reason: str) -> None:
        self.bad_frames += 1
        if self.bad_frames <= 10:
            log.warning("%s@%d-%d: skipping undecodable frame: %s", self.journal, begin, end,
                        reason)


def _line_bounds(arr: np.ndarray, final: bool
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Starts and ends (without ``\\n`` and a ``\\r`` before it) of the complete lines
    of `arr`, where the ``\\r`` dropped were, and the bytes the lines use (with `final`,
    a last line without ``\\n`` too)."""
    nl = np.flatnonzero(arr == _NL)
    used = int(nl[-1]) + 1 if len(nl) else 0
    if final and used < len(arr):
        nl = np.append(nl, len(arr))
        used = len(arr)
    starts = np.empty(len(nl), dtype=np.int64)
    if len(nl):
        starts[0] = 0
        starts[1:] = nl[:-1] + 1
    ends = nl.astype(np.int64)
    dropped = ends[:0]
    if len(ends):
        cr = (arr[np.maximum(ends - 1, 0)] == _CR) & (ends > starts)
        if cr.any():
            ends = ends - cr
            dropped = ends[cr]
    return starts, ends, dropped, used


def _gather(data: bytes, starts: np.ndarray, ends: np.ndarray, dropped: np.ndarray,
            used: int) -> pa.Array:
    """The lines of ``data[:used]`` as one Arrow string array: every byte but the
    newlines and the `dropped` ``\\r``s, in one copy."""
    lengths = ends - starts
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not len(dropped):
        values: bytes | np.ndarray = data[:used].replace(b"\n", b"")  # ~2x a numpy mask
    else:
        arr = np.frombuffer(data, dtype=np.uint8, count=used)
        keep = arr != _NL
        keep[dropped] = False
        values = arr[keep]
    big = offsets[-1] >= 1 << 31
    out = pa.Array.from_buffers(pa.large_string() if big else pa.string(), len(starts), [
        None, pa.py_buffer(offsets if big else offsets.astype(np.int32)),
        pa.py_buffer(values)])
    return out.cast(pa.string()) if big else out


class LinesDecoder(Decoder):
    """Every line a row, as text."""

    def decode(self, data: bytes, base: int, final: bool) -> tuple[list[Block], int]:
        arr = np.frombuffer(data, dtype=np.uint8)
        starts, ends, dropped, used = _line_bounds(arr, final)
        values = _gather(data, starts, ends, dropped, used)
        nl_ends = np.append(starts[1:], used) if len(starts) else starts
        return [Block(starts + base, nl_ends + base, values)], used


class FramingDecoder(Decoder):
    """A message library framing, frame by frame (csv, fixed, and json's slow path)."""

    def __init__(self, journal: str, content_type: str, message_type: str = "",
                 binary: bool = False) -> None:
        super().__init__(journal)
        options: dict[str, Any] = {}
        if message_type:
            options["message_type"] = load_attr(message_type, "messageType")
        self.framing = framing_for(content_type, **options)
        self.binary = binary

    def decode(self, data: bytes, base: int, final: bool) -> tuple[list[Block], int]:
        frames, used = self.framing.decode(data, final=final)
        return [self.block(data, base, frames)], used

    def block(self, data: bytes, base: int, frames: list[Frame]) -> Block:
        good: list[Frame] = []
        for f in frames:
            if f.error is not None:
                self._bad(base + f.begin, base + f.end, f.error)
            else:
                good.append(f)
        uuids = [_uuid_of(f.message) for f in good]
        values = [self.value(data, f) for f in good]
        texts = [text_of(u) if u else None for u in uuids]
        return Block(np.array([base + f.begin for f in good], dtype=np.int64),
                     np.array([base + f.end for f in good], dtype=np.int64),
                     pa.array(values, pa.binary() if self.binary else pa.string()),
                     pa.array(texts, pa.string()), from_ints(uuids))

    def value(self, data: bytes, frame: Frame) -> Any:
        raw = data[frame.begin:frame.end]
        if self.binary:  # fixed: the payload behind the 8-byte header
            return raw[8:]
        return raw.rstrip(b"\r\n").decode("utf-8", "replace")


def _uuid_of(message: Any) -> int:
    get = getattr(message, "get_uuid", None)
    return (get() or 0) if get is not None else 0


class JsonDecoder(Decoder):
    """ndjson: Arrow's JSON reader for whole blocks, the library's framing otherwise."""

    def __init__(self, journal: str, data_type: pa.StructType | None = None) -> None:
        super().__init__(journal)
        self.data_type = data_type
        fields = [pa.field("uuid", pa.string())]
        if data_type is not None:
            fields += [f for f in data_type if f.name != "uuid"]
        self._parse = pa_json.ParseOptions(explicit_schema=pa.schema(fields),
                                           unexpected_field_behavior="ignore")
        self._read = pa_json.ReadOptions(use_threads=False, block_size=BLOCK + (1 << 20))
        self._slow = FramingDecoder(journal, "application/x-ndjson")

    def decode(self, data: bytes, base: int, final: bool) -> tuple[list[Block], int]:
        arr = np.frombuffer(data, dtype=np.uint8)
        starts, ends, dropped, used = _line_bounds(arr, final)
        keep = ends > starts
        if not keep.all():
            starts, ends = starts[keep], ends[keep]
        nl_ends = _next_line_starts(arr, ends, used)
        fast = self._fast(data, used, starts, ends, dropped, nl_ends, base)
        if fast is not None:
            return [fast], used
        frames, used_slow = self._slow.framing.decode(data[:used], final=True)
        assert used_slow == used
        block = self._slow.block(data, base, frames)
        self.bad_frames = self._slow.bad_frames
        if self.data_type is not None:
            block.data = self._data_of(block.values)
        return [block], used

    def _fast(self, data: bytes, used: int, starts: np.ndarray,
              ends: np.ndarray, dropped: np.ndarray, nl_ends: np.ndarray, base: int
              ) -> Block | None:
        if not len(starts):
            return Block(starts, ends, pa.array([], pa.string()))
        try:
            table = pa_json.read_json(pa.BufferReader(pa.py_buffer(data).slice(0, used)),
                                      read_options=self._read, parse_options=self._parse)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != len(starts):
            return None  # a line Arrow reads differently (a blank one of spaces)
        uuid_text = table.column("uuid").combine_chunks()
        uuids = parse_text_column(uuid_text)
        if uuids is None:
            return None
        block = Block(starts + base, nl_ends + base, _gather(data, starts, ends, dropped, used),
                      uuid_text,
                      uuids)
        if self.data_type is not None:
            block.data = pa.StructArray.from_arrays(
                [table.column(f.name).combine_chunks() for f in self.data_type],
                fields=list(self.data_type))
        return block

    def _data_of(self, values: pa.Array) -> pa.Array:
        assert self.data_type is not None
        rows = []
        for v in values.to_pylist():
            try:
                t = pa_json.read_json(pa.BufferReader(v.encode()), parse_options=self._parse)
                rows.append(t.to_pylist()[0] if t.num_rows else None)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                rows.append(None)
        fields = list(self.data_type)
        return pa.array([None if r is None else {f.name: r.get(f.name) for f in fields}
                         for r in rows], self.data_type)


def _next_line_starts(arr: np.ndarray, ends: np.ndarray, used: int) -> np.ndarray:
    """Where the frame of each line ends: after its newline (the end of `used`)."""
    out = ends.copy()
    if len(out):
        nl = np.flatnonzero(arr[:used] == _NL)
        idx = np.searchsorted(nl, ends)
        out = np.where(idx < len(nl), nl[np.minimum(idx, len(nl) - 1)] + 1, used)
    return out.astype(np.int64)


def decoder_for(journal: str, framing: str, message_type: str = "",
                data_type: pa.StructType | None = None) -> Decoder:
    if framing == "lines":
        return LinesDecoder(journal)
    if framing == "json":
        return JsonDecoder(journal, data_type)
    if framing == "csv":
        return FramingDecoder(journal, "text/csv", message_type)
    return FramingDecoder(journal, "application/x-protobuf-fixed", message_type, binary=True)
