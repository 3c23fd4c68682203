"""``text/csv``: one CSV record per message (RFC 4180: the ``csv`` module's "excel"
dialect, strict quoting, UTF-8), the message UUID in column 0.

Quoted fields may hold commas, quotes and line breaks, so frame boundaries come from the
``csv`` parser, fed one line at a time: a frame is a record with its line ending. Blank
lines are no records and yield no frames. Malformed CSV (a stray quote...), text that is
not UTF-8, a record the message type rejects (for `CsvRecord`: column 0 not empty and not
a v1 UUID) or a record longer than ``max_frame`` is an error frame, and decoding goes on
with the next line. A quoted field still open at the end of the data is an incomplete
record (unconsumed), or an error frame with ``final``.

Messages: `CsvRecord` (the default), or any type `message_type` knows (dataclasses and
pydantic models take columns in field order, strings converted to the field types).
``csv.field_size_limit`` is raised to ``max_frame`` (it is process-wide).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

from gazette.errors import ValidationError
from gazette.message.adapters import MessageType, to_builtins
from gazette.message.adapters import message_type as _message_type_of
from gazette.message.base import Frame
from gazette.message.framing.ndjson import DEFAULT_MAX_FRAME, check_max_frame
from gazette.message.types import NO_ACKNOWLEDGEMENT, CsvRecord


class _TooLarge(Exception):
    pass


class _Lines:
    """The lines of data[:limit] as text, one per `next`, for a csv.reader; tracks how
    many bytes the reader took (`pos`) and where the current record began (`start`)."""

    __slots__ = ("bad_utf8", "data", "exhausted", "limit", "max_frame", "pos", "start")

    def __init__(self, data: bytes, limit: int, max_frame: int) -> None:
        self.data, self.limit, self.max_frame = data, limit, max_frame
        self.pos = self.start = 0
        self.exhausted = self.bad_utf8 = False

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        pos = self.pos
        if pos >= self.limit:
            self.exhausted = True
            raise StopIteration
        nl = self.data.find(b"\n", pos, self.limit)
        end = self.limit if nl < 0 else nl + 1
        self.pos = end
        size = end - self.start
        if nl >= 0:  # not counting the final line ending
            size -= 2 if nl > pos and self.data[nl - 1] == 0x0D else 1
        if size > self.max_frame:
            raise _TooLarge
        chunk = self.data[pos:end]
        try:
            return chunk.decode()
        except UnicodeDecodeError:
            self.bad_utf8 = True
            return chunk.decode(errors="replace")

    def next_record(self) -> None:
        self.start = self.pos
        self.bad_utf8 = False


class CsvFraming:
    """CSV records. Options: ``message_type`` (default `CsvRecord`) and ``max_frame``
    (bytes of a record, not counting its final line ending; default 64 MiB)."""

    content_type = "text/csv"

    def __init__(self, message_type: Any = CsvRecord, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.message_type: MessageType[Any] = _message_type_of(message_type)
        self.max_frame = check_max_frame(max_frame)
        if csv.field_size_limit() < max_frame:
            csv.field_size_limit(max_frame)

    def __repr__(self) -> str:
        return f"CsvFraming({self.message_type!r}, max_frame={self.max_frame})"

    def encode(self, messages: Sequence[Any]) -> bytes:
        """One record per message, lines ending in CRLF (`NO_ACKNOWLEDGEMENT` is none).
        A message becomes its `to_builtins` list, or the values of its dict (None is an
        empty column)."""
        out = io.StringIO()
        writer = csv.writer(out)
        records: list[bytes] = []
        for i, message in enumerate(messages):
            if message is NO_ACKNOWLEDGEMENT:
                continue
            row = message if isinstance(message, list) else to_builtins(message)
            if isinstance(row, dict):
                row = list(row.values())
            if not isinstance(row, list):
                raise ValidationError(f"messages[{i}]", (
                    f"a {type(message).__name__} cannot be written as a CSV record"))
            if not row:
                raise ValidationError(
                    f"messages[{i}]", "an empty record cannot be framed (it reads as a blank line)")
            out.seek(0)
            out.truncate()
            writer.writerow(row)
            try:
                record = out.getvalue().encode()
            except UnicodeEncodeError as exc:
                raise ValidationError(f"messages[{i}]", f"is not UTF-8 text: {exc}") from None
            if len(record) - 2 > self.max_frame:
                raise ValidationError(f"messages[{i}]", (
                    f"encodes to {len(record) - 2} bytes, above max_frame ({self.max_frame})"))
            records.append(record)
        return b"".join(records)

    def decode(self, data: bytes, final: bool = False) -> tuple[list[Frame], int]:
        frames: list[Frame] = []
        n = len(data)
        lines = _Lines(data, n if final else data.rfind(b"\n") + 1, self.max_frame)
        reader = csv.reader(lines, strict=True)
        from_builtins = self.message_type.from_builtins
        while True:
            begin = lines.start
            try:
                row = next(reader)
            except StopIteration:
                break
            except _TooLarge:
                frames.append(Frame(begin, lines.pos, None, (
                    f"record longer than max_frame ({self.max_frame} bytes)")))
                lines.next_record()
                continue
            except csv.Error as exc:
                if lines.exhausted:  # the data ended inside a quoted field
                    if final:
                        frames.append(Frame(begin, n, None, (
                            f"invalid CSV: {exc} (a quoted field is not closed)")))
                        lines.start = n
                    break
                frames.append(Frame(begin, lines.pos, None, f"invalid CSV: {exc}"))
                lines.next_record()
                continue
            end = lines.pos
            bad_utf8 = lines.bad_utf8
            lines.next_record()
            if not row:
                continue
            if bad_utf8:
                frames.append(Frame(begin, end, None, "invalid CSV: not UTF-8 text"))
                continue
            try:
                message = from_builtins(row)
            except (ValueError, TypeError) as exc:
                frames.append(Frame(begin, end, None, f"invalid message: {exc}"))
                continue
            frames.append(Frame(begin, end, message))
        consumed = lines.start
        if not final and n - consumed > self.max_frame:
            frames.append(Frame(consumed, n, None, (
                f"record longer than max_frame ({self.max_frame} bytes): skipped the"
                f" {n - consumed} bytes read so far")))
            consumed = n
        return frames, consumed


__all__ = ["CsvFraming"]
