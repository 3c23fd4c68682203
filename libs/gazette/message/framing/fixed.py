"""``application/x-protobuf-fixed``: protobuf messages behind a fixed 8-byte header.

A frame is the magic word ``66 33 93 36`` (hex), a 4-byte little-endian unsigned length,
then that many bytes of a serialized protobuf message: the layout of Gazette's own fixed
framing, so journals written by either can be read by the other.

Messages are `ProtoMessage` wrappers of the ``message_type`` class (or `AtLeastOnce`
values for ``message_type=AtLeastOnce[Cls]``); see `gazette.message.types` for the
``uuid`` field convention. Decoding errors, each reported as an error frame:

- de-synchronization (bytes that do not start with the magic word): the bytes up to the
  next magic word are skipped as one error frame ("skipped N bytes to the next frame");
  while no magic word follows, all but the last 3 bytes (which may begin one) are;
- a length above ``max_frame``: the header and what follows up to the next magic word;
- a payload that is not a valid message: the frame, and decoding goes on after it;
- with ``final``, a truncated header or frame at the end.

An incomplete frame (more bytes are needed) is left unconsumed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from google.protobuf.message import Message as ProtoBase

from gazette.errors import ValidationError
from gazette.message.adapters import MessageType
from gazette.message.adapters import message_type as _message_type_of
from gazette.message.base import Frame
from gazette.message.framing.ndjson import DEFAULT_MAX_FRAME, check_max_frame
from gazette.message.types import (
    NO_ACKNOWLEDGEMENT,
    AtLeastOnce,
    ProtoMessage,
)

#: The word that begins every fixed frame (Gazette's ``FixedFrameWord``).
FIXED_FRAME_MAGIC = b"\x66\x33\x93\x36"
#: Bytes of a frame header: the magic word and the little-endian payload length.
FIXED_FRAME_HEADER_LENGTH = 8

_HEADER = struct.Struct("<4sI")
_LENGTH = struct.Struct("<I")
_MAX_LENGTH = (1 << 32) - 1


class FixedProtoFraming:
    """Fixed-header protobuf frames. Options: ``message_type`` (a generated protobuf
    class, or ``AtLeastOnce[Cls]``; needed to decode, not to encode) and ``max_frame``
    (bytes of payload; default 64 MiB)."""

    content_type = "application/x-protobuf-fixed"

    def __init__(self, message_type: Any = None, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.message_type: MessageType[Any] | None = None
        if message_type is not None:
            mt = _message_type_of(message_type)
            if mt.proto_class is None:
                raise ValidationError("message_type", (
                    f"{self.content_type} frames protobuf messages: give a generated"
                    f" protobuf message class, not {mt!r}"))
            self.message_type = mt
        self.max_frame = check_max_frame(max_frame)

    def __repr__(self) -> str:
        return f"FixedProtoFraming({self.message_type!r}, max_frame={self.max_frame})"

    def encode(self, messages: Sequence[Any]) -> bytes:
        """The frames of protobuf messages, bare or wrapped in `ProtoMessage` or
        `AtLeastOnce` (`NO_ACKNOWLEDGEMENT` is no frame)."""
        out = bytearray()
        for i, message in enumerate(messages):
            if message is NO_ACKNOWLEDGEMENT:
                continue
            proto = message
            if isinstance(proto, AtLeastOnce):
                proto = proto.value
            if isinstance(proto, ProtoMessage):
                proto = proto.proto
            if not isinstance(proto, ProtoBase):
                raise ValidationError(f"messages[{i}]", (
                    f"expected a protobuf message (or ProtoMessage), got {type(message).__name__}"))
            payload = proto.SerializeToString()
            if len(payload) > min(self.max_frame, _MAX_LENGTH):
                raise ValidationError(f"messages[{i}]", (
                    f"encodes to {len(payload)} bytes, above max_frame ({self.max_frame})"))
            out += _HEADER.pack(FIXED_FRAME_MAGIC, len(payload))
            out += payload
        return bytes(out)

    def decode(self, data: bytes, final: bool = False) -> tuple[list[Frame], int]:
        if self.message_type is None:
            raise ValidationError("message_type", (
                f"decoding {self.content_type} needs the protobuf message class:"
                f" framing_for({self.content_type!r}, message_type=MyMessage)"))
        from_protobuf = self.message_type.from_protobuf
        max_frame = self.max_frame
        frames: list[Frame] = []
        view = memoryview(data)
        n = len(data)
        pos = 0
        while pos < n:
            if not data.startswith(FIXED_FRAME_MAGIC, pos):
                skip_to = self._next_magic(data, pos, final)
                if skip_to is None:
                    break
                frames.append(Frame(pos, skip_to, None, (
                    f"skipped {skip_to - pos} bytes to the next frame (de-synchronized:"
                    " no frame header here)")))
                pos = skip_to
                continue
            if n - pos < FIXED_FRAME_HEADER_LENGTH:
                if final:
                    frames.append(Frame(pos, n, None, (
                        f"truncated frame: {n - pos} bytes of an 8-byte header at the end")))
                    pos = n
                break
            (length,) = _LENGTH.unpack_from(data, pos + 4)
            if length > max_frame:
                skip_to = self._next_magic(data, pos, final)
                if skip_to is None:  # pragma: no cover - a full header is at least 8 bytes
                    break
                frames.append(Frame(pos, skip_to, None, (
                    f"frame of {length} bytes is larger than max_frame ({max_frame}):"
                    f" skipped {skip_to - pos} bytes to the next frame")))
                pos = skip_to
                continue
            end = pos + FIXED_FRAME_HEADER_LENGTH + length
            if end > n:
                if final:
                    frames.append(Frame(pos, n, None, (
                        f"truncated frame: its header says {length} bytes, only"
                        f" {n - pos - FIXED_FRAME_HEADER_LENGTH} remain")))
                    pos = n
                break
            try:
                message = from_protobuf(view[pos + FIXED_FRAME_HEADER_LENGTH:end])
            except (ValueError, TypeError) as exc:
                frames.append(Frame(pos, end, None, f"invalid message: {exc}"))
            else:
                frames.append(Frame(pos, end, message))
            pos = end
        return frames, pos

    @staticmethod
    def _next_magic(data: bytes, pos: int, final: bool) -> int | None:
        """Where the next magic word after `pos` begins; without one, the end (if final)
        or the start of the last 3 bytes (None if that is not past `pos`)."""
        found = data.find(FIXED_FRAME_MAGIC, pos + 1)
        if found >= 0:
            return found
        if final:
            return len(data)
        keep_from = len(data) - (len(FIXED_FRAME_MAGIC) - 1)
        return keep_from if keep_from > pos else None


__all__ = ["FIXED_FRAME_HEADER_LENGTH", "FIXED_FRAME_MAGIC", "FixedProtoFraming"]
