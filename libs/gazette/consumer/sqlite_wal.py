"""A SQLite WAL as `SQLiteStore` records it: which page each frame holds, and each
frame told as its difference from the page's version before it.

A frame is 24 bytes of header (page number, the database's size in pages if it ends
a transaction, salts, checksums) and the page. The version of a page before a frame is
its last frame earlier in the same WAL or, if none, the page in the database file
(which changes only at checkpoints and rewrites, both recorded), or zeros past the
database's end. A player holds the same files at that point of the log, so it finds
the same versions: a frame is recorded as a `PATCH` of its page XORed with that version
(a row update changes a few hundred bytes of a page: the rest compresses to nothing).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator

import numpy as np

#: The WAL's header, and each frame's header (before its page), in bytes.
WAL_HEADER, FRAME_HEADER = 32, 24
#: Pieces of the WAL smaller than this are recorded whole (a patch's fixed costs).
PATCH_MIN_BYTES = 256 << 10
#: A patch's blocks, packed as `gazette.recoverylog.ops` has them.
PATCH_BLOCK_DTYPE = np.dtype([("fnode", "<u4"), ("offset", "<u8"), ("length", "<u4")])


class WalFrames:
    """The frames of one WAL since it began (SQLite restarts it at checkpoints)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.frame_bytes = FRAME_HEADER + page_size
        self._headers = struct.Struct(f">II{self.frame_bytes - 8}x")
        #: Each page's last frame: the WAL offset of its bytes.
        self.latest: dict[int, int] = {}
        #: The database's size in pages as of the last transaction's frame.
        self.npages = 0

    def restart(self) -> None:
        self.latest, self.npages = {}, 0

    def end_of(self, frames: int) -> int:
        """The WAL's size holding `frames` frames."""
        return WAL_HEADER + frames * self.frame_bytes if frames else 0

    def read(self, fd: int, start: int, end: int, piece: int
             ) -> Iterator[tuple[int, bytes, list[int]]]:
        """The WAL's bytes [start, end) in pieces of whole frames (about `piece` bytes),
        each with, for each of its frames, the WAL offset of its page's version before
        (-1: none in this WAL); the frames are noted as read."""
        fs = self.frame_bytes
        per_read = max(1, piece // fs) * fs
        while start < end:
            first = WAL_HEADER if start == 0 else 0
            size = min(end - start, per_read + first)
            data = os.pread(fd, size, start)
            if len(data) != size:
                raise OSError(f"the WAL is shorter than SQLite says ({start + len(data)} "
                              f"bytes, not {end})")
            at = start + first + FRAME_HEADER
            latest, before = self.latest, []
            for page, commit in self._headers.iter_unpack(memoryview(data)[first:]):
                before.append(latest.get(page, -1))
                latest[page] = at
                at += fs
                if commit:
                    self.npages = commit
            yield start, data, before
            start += size

    def worth_patching(self, data: bytes, before: list[int], db_pages: int) -> bool:
        """Whether a piece is worth a patch: big enough, and most of its frames have a
        version before them (a patch of pages new to the database only compresses
        them: cheaper recorded whole)."""
        if len(data) < PATCH_MIN_BYTES:
            return False
        first = WAL_HEADER if len(data) % self.frame_bytes else 0
        pages = np.frombuffer(data, ">u4", offset=first)[::self.frame_bytes // 4]
        have = (np.array(before) >= 0) | (pages <= db_pages)
        return bool(have.sum() * 2 >= len(before))

    def copies(self) -> list[tuple[int, int]]:
        """A checkpoint's copies: (WAL offset, database offset) of each page's last
        frame, for the pages the database holds as of the last transaction (SQLite's
        checkpoint leaves out the pages past its end)."""
        ps = self.page_size
        return sorted((at, (page - 1) * ps) for page, at in self.latest.items()
                      if page <= self.npages)

    def patch(self, data: bytes, start: int, before: list[int], wal_fd: int,
              wal_fnode: int, db: np.ndarray, db_fnode: int
              ) -> tuple[bytes, bytes, set[int]]:
        """`data` (the WAL's bytes at `start`, whole frames, as `read` gave them with
        `before`) told as a patch: its blocks (packed), the bytes XORed with them, and
        the fnodes they read. `db`: the database file's pages (rows). Reads the WAL
        before `start` and `db`: they must not change meanwhile (any thread)."""
        fs, ps = self.frame_bytes, self.page_size
        first = WAL_HEADER if start == 0 else 0
        n = (len(data) - first) // fs
        frames = np.frombuffer(data, np.uint8, count=n * fs, offset=first).reshape(n, fs)
        pages = frames[:, :4].copy().view(">u4").ravel().astype(np.int64)
        prior = np.array(before, dtype=np.int64)
        base = np.zeros((n, ps), np.uint8)
        in_wal = prior >= 0
        if in_wal.any():
            length = start + len(data)
            with mmap.mmap(wal_fd, length, prot=mmap.PROT_READ) as view:
                wal = np.frombuffer(view, np.uint8, count=((length - WAL_HEADER) // fs) * fs,
                                    offset=WAL_HEADER).reshape(-1, fs)
                base[in_wal] = wal[(prior[in_wal] - WAL_HEADER - FRAME_HEADER) // fs,
                                   FRAME_HEADER:]
                del wal
        in_db = ~in_wal & (pages <= len(db))
        if in_db.any():
            base[in_db] = db[pages[in_db] - 1]
        xored = frames.copy()
        xored[:, FRAME_HEADER:] ^= base
        table = np.zeros(2 * n + (1 if first else 0), PATCH_BLOCK_DTYPE)
        blocks = table[1:] if first else table
        if first:
            table[0]["length"] = WAL_HEADER
        blocks["length"][0::2] = FRAME_HEADER
        blocks["length"][1::2] = ps
        page_blocks = blocks[1::2]
        page_blocks["fnode"][in_wal] = wal_fnode
        page_blocks["offset"][in_wal] = prior[in_wal]
        page_blocks["fnode"][in_db] = db_fnode
        page_blocks["offset"][in_db] = (pages[in_db] - 1) * ps
        sources = ({wal_fnode} if in_wal.any() else set()) | \
            ({db_fnode} if in_db.any() else set())
        return table.tobytes(), data[:first] + xored.tobytes(), sources


def database_pages(fd: int, page_size: int) -> tuple[mmap.mmap | None, np.ndarray]:
    """The database file's pages, mapped (rows of `page_size` bytes; close the map when
    the file changes)."""
    size = os.fstat(fd).st_size // page_size * page_size
    if not size:
        return None, np.zeros((0, page_size), np.uint8)
    view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    return view, np.frombuffer(view, np.uint8).reshape(-1, page_size)
