"""Recorded operations: the frames a recovery log holds (pure encoding, no I/O).

Each frame is one file-system operation of a store, in the order it happened:

    magic "RL" | version | kind | crc32 | seq_no | checksum | author | fnode | offset
    | length | path length | path (UTF-8) | data (`length` bytes, writes only)

little-endian, 50 bytes before the path. `crc32` covers everything after itself, so a
torn or corrupt frame is found where it starts. `seq_no` numbers the operations of the
log's one lineage; `checksum` is the lineage's checksum before the operation (see
`fsm.FSM`): a frame appended by a writer that lost the log (a fenced-out primary whose
append raced its successor's) is out of sequence and is skipped by every reader alike.

Files are *fnodes* (like inodes): `CREATE` makes one (its id is its `seq_no`) linked at
a path; `LINK`/`UNLINK` add and drop paths (a rename is both; an fnode with no path
left is dead, and so is every frame that wrote it); `WRITE` puts `data` at `offset`;
`TRUNCATE` sets its size to `length`; `COPY` copies blocks from another live file
(`offset` names the source fnode; `data` is the block size and the (source offset,
offset) of each block: `copies`), what a store that moves its own bytes between its
files records instead of the bytes (SQLite's checkpoints copy pages from its WAL into
its database). `PATCH` writes a stretch at `offset` given as blocks XORed with
blocks of live files (or with zeros), compressed (`patch_data`): a store that rewrites
pages records how each differs from its version before (SQLite's WAL frames); `path`
lists the fnodes it reads. `NOOP` writes nothing: a new primary appends one to take the
log over (its `author` from then on).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from types import ModuleType

import cramjam

from gazette.errors import GazetteError
from gazette.protocol.crc import crc32

_np: ModuleType | None
try:  # (XOR of patches: numpy if it is there, 40 times faster than Python's ints)
    import numpy as _np
except ImportError:  # pragma: no cover - numpy comes with the sqlite extra
    _np = None

MAGIC = b"RL"
VERSION = 1
_HEADER = struct.Struct("<2sBBIQIIQQQH")
HEADER_SIZE = _HEADER.size
#: Bounds that make a corrupt length fail clearly instead of allocating it.
MAX_PATH_BYTES = 4096
MAX_WRITE_BYTES = 64 << 20


class Kind(enum.IntEnum):
    NOOP = 0
    CREATE = 1
    WRITE = 2
    TRUNCATE = 3
    LINK = 4
    UNLINK = 5
    COPY = 6
    PATCH = 7


class CorruptLog(GazetteError):
    """A recovery log holds bytes that are not a valid frame where one must start."""

    def __init__(self, log: str, offset: int, reason: str) -> None:
        super().__init__(f"recovery log {log}: corrupt at offset {offset}: {reason}")
        self.log, self.offset, self.reason = log, offset, reason


@dataclass(frozen=True, slots=True)
class Op:
    """One operation (without its data). `begin`/`end`: its frame's offsets in the log
    (set when read back; 0 when recorded)."""

    kind: Kind
    seq_no: int
    checksum: int
    author: int
    fnode: int = 0
    offset: int = 0
    length: int = 0
    path: str = ""
    crc: int = 0
    begin: int = 0
    end: int = 0


def encode(kind: Kind, seq_no: int, checksum: int, author: int, *, fnode: int = 0,
           offset: int = 0, length: int = 0, path: str = "",
           data: bytes | bytearray | memoryview = b"") -> tuple[bytes, int]:
    """The frame of one operation, and its crc (which the next checksum chains)."""
    head, raw_path, crc = _framed(kind, seq_no, checksum, author, fnode, offset, length,
                                  path, data)
    return b"".join((head, raw_path, data)), crc


def record(into: bytearray, kind: Kind, seq_no: int, checksum: int, author: int,
           begin: int, *, fnode: int = 0, offset: int = 0, length: int = 0, path: str = "",
           data: bytes | bytearray | memoryview = b"") -> Op:
    """Append the frame of one operation to `into` (its bytes copied once), and return
    the `Op` it is once it lands at `begin` (what a writer that knows where its append
    lands applies, without decoding it again)."""
    head, raw_path, crc = _framed(kind, seq_no, checksum, author, fnode, offset, length,
                                  path, data)
    into += head
    into += raw_path
    into += data
    return Op(kind, seq_no, checksum, author, fnode, offset, length, path, crc, begin,
              begin + len(head) + len(raw_path) + len(data))


def record_in_place(frame: memoryview, kind: Kind, seq_no: int, checksum: int,
                    author: int, begin: int, *, fnode: int = 0, offset: int = 0) -> Op:
    """Frame the data already in `frame` after `HEADER_SIZE` bytes of room (a `WRITE`
    or `PATCH` read straight into its frame's buffer: no copy of it), writing the header
    in that room; the `Op` it is once it lands at `begin`."""
    data = frame[HEADER_SIZE:]
    head, _, crc = _framed(kind, seq_no, checksum, author, fnode, offset, len(data), "",
                           data)
    frame[:HEADER_SIZE] = head
    return Op(kind, seq_no, checksum, author, fnode, offset, len(data), "", crc, begin,
              begin + len(frame))


def _framed(kind: Kind, seq_no: int, checksum: int, author: int, fnode: int, offset: int,
            length: int, path: str, data: bytes | bytearray | memoryview
            ) -> tuple[bytes, bytes, int]:
    """A frame's header (with its crc) and path, and the crc."""
    raw_path = path.encode()
    if len(raw_path) > MAX_PATH_BYTES:
        raise ValueError(f"path of {len(raw_path)} bytes is over {MAX_PATH_BYTES}")
    if kind in _CARRIES_DATA:
        if length != len(data):
            raise ValueError(f"a {kind.name} of {len(data)} bytes says length {length}")
        if length > MAX_WRITE_BYTES:
            raise ValueError(f"a {kind.name} of {length} bytes is over {MAX_WRITE_BYTES}")
    elif data:
        raise ValueError(f"only a write or copy carries data, not {kind.name}")
    head = _HEADER.pack(MAGIC, VERSION, kind, 0, seq_no, checksum, author, fnode, offset,
                        length, len(raw_path))
    crc = crc32(data, crc32(raw_path, crc32(head[8:], 0)))
    return b"".join((head[:4], crc.to_bytes(4, "little"), head[8:])), raw_path, crc


_CARRIES_DATA = frozenset((Kind.WRITE, Kind.COPY, Kind.PATCH))
_COPY_BLOCK = struct.Struct("<I")
_COPY_PAIR = struct.Struct("<QQ")


def copy_data(block: int, pairs: list[tuple[int, int]] | bytes) -> bytes:
    """A `COPY`'s data: blocks of `block` bytes, each (source offset, offset), or
    those packed (16 bytes each, little-endian)."""
    if isinstance(pairs, bytes):
        if len(pairs) % _COPY_PAIR.size:
            raise ValueError(f"packed copies of {len(pairs)} bytes")
        return _COPY_BLOCK.pack(block) + pairs
    return _COPY_BLOCK.pack(block) + b"".join(_COPY_PAIR.pack(s, d) for s, d in pairs)


def copies(data: bytes | bytearray | memoryview) -> tuple[int, list[tuple[int, int]]]:
    """A `COPY`'s block size and its (source offset, offset) pairs."""
    if len(data) < _COPY_BLOCK.size or (len(data) - _COPY_BLOCK.size) % _COPY_PAIR.size:
        raise ValueError(f"copy data of {len(data)} bytes is not a block size and pairs")
    (block,) = _COPY_BLOCK.unpack_from(data)
    return block, list(_COPY_PAIR.iter_unpack(memoryview(data)[_COPY_BLOCK.size:]))


_PATCH_COUNT = struct.Struct("<I")
_PATCH_BLOCK = struct.Struct("<IQI")  # source fnode (0: zeros), source offset, length
#: zstd's level for patches (negative: faster, less compression).
PATCH_LEVEL = 1
#: The most bytes a patch writes (a corrupt one fails clearly instead of inflating).
MAX_PATCH_BYTES = 256 << 20

Block = tuple[int, int, int]


def patch_data(blocks: list[Block] | bytes, xored: bytes | bytearray | memoryview) -> bytes:
    """A `PATCH`'s data: its blocks (source fnode, source offset, length) in order, or
    those packed (16 bytes each, little-endian: as `pack_blocks`), and the bytes each
    is XORed with (their lengths summed), compressed."""
    if isinstance(blocks, bytes):  # (packed by a caller that made them add up)
        table = blocks
        if len(table) % _PATCH_BLOCK.size:
            raise ValueError(f"a packed block table of {len(table)} bytes")
    else:
        total = sum(b[2] for b in blocks)
        if total != len(xored):
            raise ValueError(f"blocks of {total} bytes, XORed with {len(xored)}")
        table = pack_blocks(blocks)
    count = _PATCH_COUNT.pack(len(table) // _PATCH_BLOCK.size)
    return bytes(packed_patch(b"".join((count, table, xored))))


def patch_room(blocks: int) -> int:
    """The bytes before a patch's XORed bytes in its data as `patch_data` lays it out
    (the count, and a table of `blocks`): room a caller leaves at the head of one buffer
    to build a patch in place (`packed_patch`), without joining copies."""
    return _PATCH_COUNT.size + blocks * _PATCH_BLOCK.size


def packed_patch(body: bytes | bytearray | memoryview) -> memoryview:
    """A `PATCH`'s data from its parts laid out in one buffer as `patch_data` joins them
    (count, packed blocks, XORed bytes), compressed (outside the GIL: a recorder's
    thread holds it as little as it can, the event loop's thread needs it)."""
    return memoryview(cramjam.zstd.compress(body, level=PATCH_LEVEL))


def compressed(data: bytes | bytearray | memoryview) -> bytes:
    """A `PATCH`'s data that writes `data` as it is (XORed with zeros: compressed)."""
    return patch_data([(0, 0, len(data))], data)


def pack_blocks(blocks: list[Block]) -> bytes:
    return b"".join(_PATCH_BLOCK.pack(*b) for b in blocks)


def patch_sources(blocks: list[Block] | None = None, sources: set[int] | None = None
                  ) -> str:
    """The `path` of a `PATCH`: the fnodes it reads (those `blocks` name, or
    `sources`)."""
    fnodes = {b[0] for b in blocks or () if b[0]} | (sources or set())
    return ",".join(str(f) for f in sorted(fnodes))


def sources_of(path: str) -> set[int]:
    try:
        return {int(f) for f in path.split(",") if f}
    except ValueError:
        raise ValueError(f"patch sources {path!r} are not fnodes") from None


def patched(data: bytes | bytearray | memoryview) -> tuple[list[Block], memoryview]:
    """A `PATCH`'s blocks and the bytes they are XORed with."""
    table, xored = patch_table(data)
    return list(_PATCH_BLOCK.iter_unpack(table)), xored


def patch_table(data: bytes | bytearray | memoryview) -> tuple[memoryview, memoryview]:
    """A `PATCH`'s blocks packed (16 bytes each: source fnode, source offset, length,
    little-endian) and the bytes they are XORed with, checked to add up."""
    try:
        raw = memoryview(cramjam.zstd.decompress(data))
    except Exception as err:  # noqa: BLE001 - cramjam's own error types
        raise ValueError(f"patch data does not decompress: {err}") from None
    if len(raw) < _PATCH_COUNT.size:
        raise ValueError("patch data has no block count")
    (count,) = _PATCH_COUNT.unpack_from(raw)
    end = _PATCH_COUNT.size + count * _PATCH_BLOCK.size
    if end > len(raw):
        raise ValueError(f"patch data is too short for its {count} blocks")
    table, xored = raw[_PATCH_COUNT.size:end], raw[end:]
    total = sum(n for _, _, n in _PATCH_BLOCK.iter_unpack(table)) if _np is None else \
        int(_np.frombuffer(table, "<u4").reshape(-1, 4)[:, 3].sum(dtype=_np.int64))
    if total != len(xored) or len(xored) > MAX_PATCH_BYTES:
        raise ValueError(f"patch blocks do not add up to its {len(xored)} bytes")
    return table, xored


def xor(a: bytes | bytearray | memoryview, b: bytes | bytearray | memoryview) -> bytes:
    """`a` XOR `b` (of one length)."""
    if _np is not None:
        out: bytes = (_np.frombuffer(a, _np.uint8) ^ _np.frombuffer(b, _np.uint8)).tobytes()
        return out
    n = len(a)
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(n, "little")


def chain(checksum: int, crc: int) -> int:
    """The lineage's checksum after an operation whose frame has `crc`."""
    return crc32(crc.to_bytes(4, "little"), checksum)


class Decoder:
    """Frames from a log's bytes, fed as they are read (in any pieces)."""

    def __init__(self, log: str, offset: int) -> None:
        self.log = log
        self.offset = offset  # of the first byte not yet decoded
        self._buf = bytearray()

    @property
    def fed(self) -> int:
        """The offset after the last byte fed (a frame may be pending before it)."""
        return self.offset + len(self._buf)

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[tuple[Op, bytes]]:
        """Every whole frame now buffered, with its data; raises `CorruptLog` (the
        frames before the corrupt one are consumed: `offset` is where it starts)."""
        self._buf += chunk
        out: list[tuple[Op, bytes]] = []
        buf, pos = self._buf, 0
        try:
            while len(buf) - pos >= HEADER_SIZE:
                frame = self._frame(buf, pos)
                if frame is None:
                    break
                out.append(frame)
                pos = frame[0].end - self.offset
        finally:
            del buf[:pos]
            self.offset += pos
        return out

    def _frame(self, buf: bytearray, pos: int) -> tuple[Op, bytes] | None:
        (magic, version, kind, crc, seq_no, checksum, author, fnode, offset, length,
         path_len) = _HEADER.unpack_from(buf, pos)
        at = self.offset + pos
        if magic != MAGIC:
            raise CorruptLog(self.log, at, f"no frame starts here ({bytes(magic)!r})")
        if version != VERSION:
            raise CorruptLog(self.log, at, f"unknown frame version {version}")
        try:
            kind = Kind(kind)
        except ValueError:
            raise CorruptLog(self.log, at, f"unknown operation {kind}") from None
        data_len = length if kind in _CARRIES_DATA else 0
        if path_len > MAX_PATH_BYTES or data_len > MAX_WRITE_BYTES:
            raise CorruptLog(self.log, at, f"impossible sizes (path {path_len}, data "
                             f"{data_len})")
        size = HEADER_SIZE + path_len + data_len
        if len(buf) - pos < size:
            return None
        with memoryview(buf) as view:
            frame = view[pos:pos + size]
            try:
                if crc32(frame[8:], 0) != crc:
                    raise CorruptLog(self.log, at, "checksum mismatch (a torn or damaged "
                                     "frame)")
                try:
                    path = bytes(frame[HEADER_SIZE:HEADER_SIZE + path_len]).decode()
                except UnicodeDecodeError:
                    raise CorruptLog(self.log, at, "path is not UTF-8") from None
                data = bytes(frame[HEADER_SIZE + path_len:])
            finally:
                frame.release()
        return Op(kind, seq_no, checksum, author, fnode, offset, length, path, crc, at,
                  at + size), data

    @property
    def pending(self) -> int:
        """Bytes of a frame not yet whole."""
        return len(self._buf)
