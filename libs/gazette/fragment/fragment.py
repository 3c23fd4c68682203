"""Fragments: byte ranges of a journal, named by what they hold.

A fragment is ``(journal, begin, end, sha1)`` plus how it is stored: its compression codec,
the store it was persisted to and when. It always holds whole appends. Its name in a store
is ``<journal>/[<postfix>/]<begin>-<end>-<sha1><ext>`` with begin and end as 16 zero-padded
hex digits, so names sort in offset order, and the extension naming the codec:
``0000000000000000-000000000000002b-92a7ee0e4be7a03fd1a3224055a9d6b7bbd6125e.sz``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gazette import names
from gazette.errors import ValidationError
from gazette.protocol import CompressionCodec

#: File extension of each codec, as in Gazette's stores.
CODEC_EXTENSIONS: dict[CompressionCodec, str] = {
    CompressionCodec.NONE: ".raw",
    CompressionCodec.GZIP: ".gz",
    CompressionCodec.SNAPPY: ".sz",
    CompressionCodec.ZSTANDARD: ".zst",
    CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION: ".gzod",
}
_CODEC_OF_EXTENSION = {ext: codec for codec, ext in CODEC_EXTENSIONS.items()}
_NAME = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{40})(\.[a-z]+)")
EMPTY_SHA1 = bytes.fromhex("da39a3ee5e6b4b0d3255bfef95601890afd80709")
#: The SHA-1 of an append's commit whose content the broker did not sum apart (one
#: made on the data path, which checks the content's CRC-32 instead).
NO_SHA1 = bytes(20)


@dataclass(frozen=True, slots=True, order=True)
class Fragment:
    """Bytes [begin, end) of `journal`, whose SHA-1 is `sha1`."""

    journal: str
    begin: int
    end: int
    sha1: bytes
    codec: CompressionCodec = CompressionCodec.NONE
    #: The store URL it was persisted to ("" while it only exists in a local spool).
    backing_store: str = ""
    #: When the store last modified it (Unix seconds; 0 if unknown or not persisted).
    mod_time: int = 0
    #: Folder between the journal and the name (e.g. ``date=2026-11-22``), or "".
    path_postfix: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.begin <= self.end < 1 << 63:
            raise ValidationError("fragment", f"bad offsets [{self.begin}, {self.end})")
        if len(self.sha1) != 20:
            raise ValidationError("fragment.sha1", f"must be 20 bytes, got {len(self.sha1)}")

    @property
    def size(self) -> int:
        """Length of its content, uncompressed."""
        return self.end - self.begin

    @property
    def content_name(self) -> str:
        return (f"{self.begin:016x}-{self.end:016x}-{self.sha1.hex()}"
                f"{CODEC_EXTENSIONS[self.codec]}")

    @property
    def path(self) -> str:
        """Its path within a store: journal, postfix folder, name."""
        postfix = f"{self.path_postfix}/" if self.path_postfix else ""
        return f"{self.journal}/{postfix}{self.content_name}"

    def contains(self, offset: int) -> bool:
        return self.begin <= offset < self.end

    @classmethod
    def parse_path(cls, path: str, backing_store: str = "", mod_time: int = 0) -> Fragment:
        """The fragment a store path names (as `path` builds it); ValidationError if the
        path is not a fragment's."""
        head, _, name = path.rpartition("/")
        m = _NAME.fullmatch(name)
        if not head or m is None:
            raise ValidationError("path", f"{path!r} is not a fragment path "
                                  "(<journal>/<begin>-<end>-<sha1>.<ext>)")
        begin, end = int(m.group(1), 16), int(m.group(2), 16)
        codec = _CODEC_OF_EXTENSION.get(m.group(4))
        if codec is None:
            raise ValidationError("path", f"{path!r}: unknown extension {m.group(4)!r}")
        if end < begin:
            raise ValidationError("path", f"{path!r}: end before begin")
        journal, postfix = head, ""
        # The journal is the longest valid journal name the head starts with that the
        # caller lists under; without more context, a postfix is recognised by '=' in it.
        parts = head.split("/")
        while len(parts) > 1 and "=" in parts[-1]:
            postfix = f"{parts.pop()}/{postfix}" if postfix else parts.pop()
        journal = "/".join(parts)
        names.validate_journal_name(journal, "path")
        return cls(journal, begin, end, bytes.fromhex(m.group(3)), codec, backing_store,
                   mod_time, postfix)


def fragment_to_pb(fragment: Fragment) -> Any:
    """The `gazette.broker.Fragment` message of a fragment."""
    from gazette.pb import broker_pb2
    from gazette.protocol.convert import codec_to_pb

    return broker_pb2.Fragment(
        journal=fragment.journal, begin=fragment.begin, end=fragment.end, sha1=fragment.sha1,
        compression_codec=codec_to_pb(fragment.codec), backing_store=fragment.backing_store,
        mod_time=fragment.mod_time, path_postfix=fragment.path_postfix)


def fragment_from_pb(msg: Any, field: str = "fragment") -> Fragment:
    """A `Fragment` from its `gazette.broker.Fragment` message (`ValidationError` naming
    `field` if it is not a valid one)."""
    from gazette.protocol.convert import codec_from_pb

    sha1 = msg.sha1 or EMPTY_SHA1
    try:
        return Fragment(msg.journal, msg.begin, msg.end, sha1,
                        codec_from_pb(msg.compression_codec, f"{field}.compression_codec"),
                        msg.backing_store, msg.mod_time, msg.path_postfix)
    except ValidationError as err:
        raise err.within(field) from None
