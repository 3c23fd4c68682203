"""What appends and reads of a journal give back: the broker hands its replicas' results
to the wire as these, and the client yields the same types to applications."""

from __future__ import annotations

from dataclasses import dataclass

from gazette.fragment.fragment import Fragment
from gazette.labels import LabelSet


@dataclass(frozen=True, slots=True)
class AppendResult:
    """A committed append: `commit` spans its bytes [begin, end) with the SHA-1 of just
    its content; `registers` are the journal's registers after it."""

    commit: Fragment
    registers: LabelSet


@dataclass(frozen=True, slots=True)
class ReadChunk:
    """`content` of the journal starting at `offset`, out of `fragment`; `write_head` as
    of this chunk (how far behind the head a reader is). The broker's reads may hand
    over a `bytearray` they read into (not copied again); clients get `bytes`."""

    offset: int
    content: bytes | bytearray
    fragment: Fragment
    write_head: int

    @property
    def end(self) -> int:
        return self.offset + len(self.content)
