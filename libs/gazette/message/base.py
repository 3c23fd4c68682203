"""The contracts of the message package: messages, envelopes, framings, errors.

A *message* is any object that can hold a UUID (the `Message` protocol); a *framing*
turns messages into delimited bytes for a journal of some content type and back; an
*envelope* is a message read from a journal with the byte range it came from. Readers
parse each message's UUID once into `Envelope.uuid`, so the Sequencer never calls back
into message objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgspec

from gazette.errors import GazetteError, ValidationError


@runtime_checkable
class Message(Protocol):
    """An object that carries its UUID (see `gazette.message.types` for ready ones)."""

    def get_uuid(self) -> int | None:
        """The UUID as an int, or None when the message has none (at-least-once)."""

    def set_uuid(self, uuid: int) -> None:
        """Store the UUID the Publisher sequenced for this message."""

    def new_acknowledgement(self, journal: str) -> Message:
        """A new, empty message of this type, to carry an ACK_TXN UUID to `journal`."""


class Envelope(msgspec.Struct, gc=False):
    """A message read from `journal` at bytes [begin, end), with its parsed UUID
    (0 when the message carries none and is delivered at-least-once).

    A msgspec Struct: readers make one per message, and its C constructor costs a
    fraction of a dataclass's. Untracked by the cycle collector (``gc=False``), which
    would otherwise scan every envelope a Sequencer's ring holds: an envelope must not
    be part of a reference cycle (its message must not refer back to it)."""

    journal: str
    begin: int
    end: int
    message: Any
    uuid: int


def uuid_of(message: Any) -> int:
    """A message's UUID as an Envelope holds it: 0 when it has none (or cannot hold one)."""
    get = getattr(message, "get_uuid", None)
    return (get() or 0) if get is not None else 0


class FrameError(GazetteError):
    """A frame that could not be decoded: where it is and why. Readers skip past it
    where the framing allows and report it."""

    def __init__(self, journal: str, begin: int, end: int, reason: str) -> None:
        self.journal, self.begin, self.end, self.reason = journal, begin, end, reason
        super().__init__(f"{journal}@{begin}-{end}: {reason}")


@dataclass(slots=True)
class Frame:
    """One decoded frame: its byte range relative to the decoded buffer, and the message
    or the reason it could not be decoded."""

    begin: int
    end: int
    message: Any = None
    error: str | None = None


class Framing(Protocol):
    """Delimits messages of one content type in a journal's byte stream."""

    content_type: str

    def encode(self, messages: Sequence[Any]) -> bytes:
        """The frames of `messages`, concatenated (one call per append batch)."""

    def decode(self, data: bytes, final: bool = False) -> tuple[list[Frame], int]:
        """Frames found in `data` and how many bytes they used; the rest is an
        incomplete frame to be completed by more data. With `final`, trailing bytes
        that cannot become a frame are reported as a `Frame` with an error. Never
        reads past a frame; a frame larger than the framing's maximum is an error
        frame, and decoding continues after it where the framing can find the next.

        A framing may also offer ``decode_envelopes(journal, base, data)``, a fast path
        `read_uncommitted` tries first: envelopes of the complete frames and the bytes
        used, or None to fall back to `decode` (see `NdjsonFraming`)."""


_FRAMINGS: dict[str, Callable[..., Framing]] = {}


def register_framing(content_type: str, factory: Callable[..., Framing]) -> None:
    """Make `factory` the framing of journals labelled ``content-type: <content_type>``.
    It is called with the options given to `framing_for` (such as the message type)."""
    _FRAMINGS[content_type] = factory


def framing_for(content_type: str, **options: Any) -> Framing:
    """A new framing for a content type; ValidationError naming the known ones if none."""
    try:
        factory = _FRAMINGS[content_type]
    except KeyError:
        known = ", ".join(sorted(_FRAMINGS)) or "none registered"
        raise ValidationError(
            "content-type", f"no framing for {content_type!r} (known: {known})") from None
    return factory(**options)
