"""``application/x-ndjson``: one JSON document per line, decoded and encoded with msgspec.

A frame is one line with its ``\\n``. Decoding never looks past the last newline unless
``final``; a line holding nothing but spaces, tabs or ``\\r`` is no message and yields no
frame. A line that is not valid JSON, or not a valid message of the message type (for
`JsonMessage`: not an object, or a ``uuid`` that is not a v1 UUID text), is an error frame
and decoding goes on with the next line. A line longer than ``max_frame`` bytes (not
counting its newline) is an error frame without being decoded; while its newline has not
arrived, the bytes buffered past ``max_frame`` are reported as an error frame and
consumed, so memory stays bounded (its remainder then fails as a line of its own).

Hot path: newline offsets come from a ``bytes.find`` loop, each line is decoded by one
msgspec call on a memoryview slice (no copy), and messages, UUID checks and frames are
built batch by batch with C-level ``map``; a batch with a bad line is redone line by line.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import add, sub
from typing import Any

import msgspec

from gazette.errors import ValidationError
from gazette.message.adapters import MessageType, to_builtins
from gazette.message.adapters import message_type as _message_type_of
from gazette.message.base import Envelope, Frame, uuid_of
from gazette.message.types import NO_ACKNOWLEDGEMENT, JsonMessage

#: Default largest message, in bytes, of every framing here (64 MiB).
DEFAULT_MAX_FRAME = 64 << 20

_BATCH = 1024
_BLANK = b" \t\r\n"


def check_max_frame(max_frame: int) -> int:
    if isinstance(max_frame, bool) or not isinstance(max_frame, int) or max_frame < 1:
        raise ValidationError("max_frame", f"must be a positive number of bytes, not {max_frame!r}")
    return max_frame


def _enc_hook(obj: Any) -> Any:
    try:
        return to_builtins(obj)
    except ValidationError:
        raise TypeError(f"Encoding objects of type {type(obj).__name__} is unsupported") from None


class NdjsonFraming:
    """Newline-delimited JSON. Options: ``message_type`` (a class `message_type`
    accepts; default `JsonMessage`) and ``max_frame`` (bytes; default 64 MiB).

    `encode` takes messages of any type msgspec encodes (dicts, dataclasses, msgspec
    Structs) or `to_builtins` converts (pydantic models, protobuf messages,
    `AtLeastOnce` values), whatever ``message_type`` is.
    """

    content_type = "application/x-ndjson"

    def __init__(self, message_type: Any = JsonMessage,
                 max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.message_type: MessageType[Any] = _message_type_of(message_type)
        self.max_frame = check_max_frame(max_frame)
        self._decoder = msgspec.json.Decoder(self.message_type.json_type)
        self._encoder = msgspec.json.Encoder(enc_hook=_enc_hook)

    def __repr__(self) -> str:
        return f"NdjsonFraming({self.message_type!r}, max_frame={self.max_frame})"

    # -- encoding ----------------------------------------------------------------------

    def encode(self, messages: Sequence[Any]) -> bytes:
        """One line per message (`NO_ACKNOWLEDGEMENT` is no line). ValidationError names
        the first message that cannot be encoded or encodes to more than max_frame."""
        if NO_ACKNOWLEDGEMENT in messages:
            messages = [m for m in messages if m is not NO_ACKNOWLEDGEMENT]
        try:
            data = self._encoder.encode_lines(messages)
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError):
            self._raise_unencodable(messages)
            raise
        if len(data) - len(messages) > self.max_frame:
            self._check_sizes(data)
        return data

    def _raise_unencodable(self, messages: Sequence[Any]) -> None:
        for i, m in enumerate(messages):
            try:
                self._encoder.encode(m)
            except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as exc:
                raise ValidationError(
                    f"messages[{i}]", f"cannot be encoded as JSON: {exc}") from None

    def _check_sizes(self, data: bytes) -> None:
        for i, line in enumerate(data.split(b"\n")):
            if len(line) > self.max_frame:
                raise ValidationError(
                    f"messages[{i}]",
                    f"encodes to {len(line)} bytes, above max_frame ({self.max_frame})")

    # -- decoding ----------------------------------------------------------------------

    def decode(self, data: bytes, final: bool = False) -> tuple[list[Frame], int]:
        frames: list[Frame] = []
        n = len(data)
        stop = data.rfind(b"\n") + 1
        if stop:
            self._decode_lines(data, stop, frames)
        if stop < n:
            if final:
                self._decode_slow(memoryview(data), [stop], [n], frames)
                stop = n
            elif n - stop > self.max_frame:
                frames.append(Frame(stop, n, None, (
                    f"line longer than max_frame ({self.max_frame} bytes): skipped the"
                    f" {n - stop} bytes read so far")))
                stop = n
        return frames, stop

    def decode_envelopes(self, journal: str, base: int, data: bytes
                         ) -> tuple[list[Envelope], int] | None:
        """The readers' fast path: envelopes of the complete lines of `data` (the bytes of
        `journal` from offset `base`) and the bytes they used, with no `Frame` in
        between and UUIDs converted in one batch; None when any line needs a closer
        look (blank, invalid, over-long), and the caller decodes frames instead."""
        stop = data.rfind(b"\n") + 1
        if len(data) - stop > self.max_frame:
            return None
        if not stop:
            return [], 0
        lines = data[:stop].split(b"\n")
        lines.pop()  # the empty tail after the last newline
        lengths = list(map(len, lines))
        if max(lengths) > self.max_frame:
            return None
        try:
            values = list(map(self._decoder.decode, lines))
            messages, uuids = self.message_type.from_decoded_many_uuids(values)
        except (msgspec.DecodeError, ValueError, TypeError):
            return None
        if uuids is None:
            uuids = list(map(uuid_of, messages))
        offsets = list(accumulate(map(add, lengths, repeat(1)), initial=base))
        return list(map(Envelope, repeat(journal), offsets[:-1], offsets[1:], messages,
                        uuids)), stop

    def _decode_lines(self, data: bytes, stop: int, frames: list[Frame]) -> None:
        """Frames of the complete lines of data[:stop] (which ends with a newline)."""
        ends: list[int] = []
        append = ends.append
        find = data.find
        pos = 0
        while (nl := find(b"\n", pos, stop)) >= 0:
            pos = nl + 1
            append(pos)
        view = memoryview(data)
        begin = 0
        for i in range(0, len(ends), _BATCH):
            batch_ends = ends[i:i + _BATCH]
            batch_begins = [begin, *batch_ends[:-1]]
            begin = batch_ends[-1]
            if not self._decode_fast(view, batch_begins, batch_ends, frames):
                self._decode_slow(view, batch_begins, batch_ends, frames)

    def _decode_fast(self, view: memoryview, begins: list[int], ends: list[int],
                     frames: list[Frame]) -> bool:
        """All lines at once; False (and no frames) if any line needs a closer look."""
        longest = self.max_frame + 1  # with its newline
        if ends[-1] - begins[0] > longest and max(map(sub, ends, begins)) > longest:
            return False
        try:
            lines = map(view.__getitem__, map(slice, begins, ends))
            values = list(map(self._decoder.decode, lines))
            messages = self.message_type.from_decoded_many(values)
        except (msgspec.DecodeError, ValueError, TypeError):
            return False
        frames.extend(map(Frame, begins, ends, messages))
        return True

    def _decode_slow(self, view: memoryview, begins: list[int], ends: list[int],
                     frames: list[Frame]) -> None:
        decode = self._decoder.decode
        mt = self.message_type
        for begin, end in zip(begins, ends, strict=True):
            line = view[begin:end]
            size = end - begin - (line[-1] == 0x0A)
            if size > self.max_frame:
                frames.append(Frame(begin, end, None, (
                    f"line of {size} bytes is longer than max_frame ({self.max_frame})")))
                continue
            if not bytes(line).strip(_BLANK):
                continue
            try:
                value = decode(line)
            except msgspec.ValidationError as exc:
                frames.append(Frame(begin, end, None, f"invalid message: {exc}"))
                continue
            except (msgspec.DecodeError, ValueError) as exc:  # ValueError: bad UTF-8
                frames.append(Frame(begin, end, None, f"invalid JSON: {exc}"))
                continue
            try:
                message = mt.from_decoded(value)
            except (ValueError, TypeError) as exc:
                frames.append(Frame(begin, end, None, f"invalid message: {exc}"))
                continue
            frames.append(Frame(begin, end, message))


__all__ = ["DEFAULT_MAX_FRAME", "NdjsonFraming", "check_max_frame"]
