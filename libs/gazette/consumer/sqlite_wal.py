"""A SQLite WAL as `SQLiteStore` records it: which page each frame holds, and each
frame told as its difference from the page's version before it.

A frame is 24 bytes of header (page number, the database's size in pages if it ends
a transaction, salts, checksums) and the page. The version of a page before a frame is
its last frame earlier in the same WAL or, if none, the page in the database file
(which changes only at checkpoints and rewrites, both recorded), or zeros past the
database's end. A player holds the same files at that point of the log, so it finds
the same versions: a frame is recorded as a `PATCH` of its page XORed with that version
(a row update changes a few hundred bytes of a page: the rest compresses to nothing).
The work is numpy's over whole pieces of the WAL, not Python's per frame.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import numpy as np

from gazette.recoverylog.blocks import COPY_PAIR_DTYPE, PATCH_BLOCK_DTYPE
from gazette.recoverylog.ops import patch_room

#: The WAL's header, and each frame's header (before its page), in bytes.
WAL_HEADER, FRAME_HEADER = 32, 24
#: Pieces of the WAL smaller than this are recorded whole (a patch's fixed costs).
PATCH_MIN_BYTES = 256 << 10


class Mapped:
    """A file mapped read-only, kept across its changes in place and mapped again
    only when it outgrew the map (what is past `size` is never read: it may be past
    the file's end by then)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map: mmap.mmap | None = None
        self._array = np.zeros(0, np.uint8)
        self.size = 0

    def view(self, size: int) -> np.ndarray:
        """The file's first `size` bytes (it holds at least that many)."""
        if size > len(self._array):
            self.close()
            length = os.fstat(self.fd).st_size  # (all of it: it may have grown more)
            mapped = self._map = mmap.mmap(self.fd, length, prot=mmap.PROT_READ)
            self._array = np.frombuffer(mapped, np.uint8)
        self.size = size
        return self._array[:size]

    def close(self) -> None:
        self._array = np.zeros(0, np.uint8)  # (first: a map with views cannot close)
        if self._map is not None:
            self._map.close()
            self._map = None


def _grown(array: np.ndarray, length: int, fill: int | bool) -> np.ndarray:
    """`array` at least `length` long (doubled at least: grown rarely), `fill` after."""
    grown = np.full(max(2 * len(array), length), fill, array.dtype)
    grown[:len(array)] = array
    return grown


class WalFrames:
    """The frames of one WAL since it began (SQLite restarts it at checkpoints)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.frame_bytes = FRAME_HEADER + page_size
        #: Each page's last frame: the WAL offset of its bytes (-1: none), by page.
        self.latest = np.full(1024, -1, np.int64)
        #: The database's size in pages as of the last transaction's frame.
        self.npages = 0
        #: Frames seen (`seen`) but not yet noted in `latest`: their pages, in WAL
        #: order, from the frame at `_unnoted_at` on (noted in one pass when asked).
        self._unnoted: list[np.ndarray] = []
        self._unnoted_at = self._unnoted_end = 0

    def restart(self) -> None:
        self.latest.fill(-1)
        self.npages = 0
        self._unnoted.clear()

    def pieces(self, start: int, end: int, piece: int) -> Iterator[tuple[int, int]]:
        """The WAL's bytes [start, end) as (offset, size) pieces of whole frames, each
        about `piece` bytes (the first with the WAL's header if `start` is 0)."""
        per_read = max(1, piece // self.frame_bytes) * self.frame_bytes
        while start < end:
            size = min(end - start, per_read + (WAL_HEADER if start == 0 else 0))
            yield start, size
            start += size

    def seen(self, start: int, data: bytes | memoryview) -> None:
        """The WAL's bytes at `start` (whole frames), read by the caller: the frames
        are noted later, all at once, when `latest` is next asked for (cheaper than
        `read`'s noting for a few frames at a time); `npages` is as of them now."""
        first = WAL_HEADER if start == 0 else 0
        words = np.frombuffer(data, ">u4", offset=first).reshape(-1, self.frame_bytes // 4)
        if not self._unnoted:
            self._unnoted_at, self._unnoted_end = start + first, start + first
        if self._unnoted_end != start + first:
            raise ValueError(f"WAL frames seen at {start}, not after those seen before "
                             f"(at {self._unnoted_end})")
        self._unnoted.append(words[:, 0].astype(np.int64))
        self._unnoted_end += len(words) * self.frame_bytes
        last = int(words[-1, 1])  # (the last frame ends a transaction, mostly)
        if not last:
            ended = np.flatnonzero(words[:, 1])
            last = int(words[ended[-1], 1]) if len(ended) else 0
        if last:
            self.npages = last

    def _note(self) -> None:
        """Note the frames seen and not noted yet: each page's last frame is the one
        furthest on (`maximum.at`: pages repeat across transactions)."""
        if not self._unnoted:
            return
        pages = self._unnoted[0] if len(self._unnoted) == 1 else \
            np.concatenate(self._unnoted)
        self._unnoted.clear()
        at = self._unnoted_at + FRAME_HEADER + \
            self.frame_bytes * np.arange(len(pages), dtype=np.int64)
        if pages.max() >= len(self.latest):
            self.latest = _grown(self.latest, int(pages.max()) + 1, -1)
        np.maximum.at(self.latest, pages, at)

    def valid_end(self, path: str) -> int | None:
        """Where the WAL at `path` ends for SQLite: after the last commit frame of its
        header's generation (frames past it, left by a generation before a checkpoint
        restarted the WAL, are not read), 0 if it holds none; None if it is not whole
        frames (a log recorded otherwise: `SQLiteStore` rewrites it)."""
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return None
        fs = self.frame_bytes
        if size == 0:
            return 0
        if size < WAL_HEADER or (size - WAL_HEADER) % fs:
            return None
        n = (size - WAL_HEADER) // fs
        mapped = np.memmap(path, np.uint8, mode="r", shape=(size,))  # (headers only read)
        salts = mapped[16:24].copy().view(">u4")
        words = mapped[WAL_HEADER:].reshape(n, fs)[:, :16].copy().view(">u4")
        del mapped
        ours = (words[:, 2] == salts[0]) & (words[:, 3] == salts[1])
        frames = n if ours.all() else int(np.argmin(ours))
        commits = np.flatnonzero(words[:frames, 1])
        return self.end_of(int(commits[-1]) + 1) if len(commits) else 0

    def end_of(self, frames: int) -> int:
        """The WAL's size holding `frames` frames."""
        return WAL_HEADER + frames * self.frame_bytes if frames else 0

    def read(self, fd: int, start: int, end: int, piece: int, *, room: bool = False
             ) -> Iterator[tuple[int, bytes | memoryview, np.ndarray, np.ndarray]]:
        """The WAL's bytes [start, end) in pieces of whole frames (about `piece` bytes),
        each with its frames' pages and, for each, the WAL offset of its page's version
        before (-1: none in this WAL); the frames are noted as read. With `room`, each
        piece is read into a buffer of its own with room before it for a patch's count
        and blocks (`ops.patch_room`), where `patch` makes the patch in place."""
        self._note()
        fs = self.frame_bytes
        for begin, size in self.pieces(start, end, piece):
            first = WAL_HEADER if begin == 0 else 0
            data: bytes | memoryview
            if room:
                head = patch_room(2 * ((size - first) // fs) + (1 if first else 0))
                data = np.empty(head + size, np.uint8).data[head:]
                read = os.preadv(fd, [data], begin)
            else:
                data = os.pread(fd, size, begin)
                read = len(data)
            if read != size:
                raise OSError(f"the WAL is shorter than SQLite says ({begin + read} "
                              f"bytes, not {end})")
            words = np.frombuffer(data, ">u4", offset=first).reshape(-1, fs // 4)
            pages, commits = words[:, 0].astype(np.int64), words[:, 1]
            at = begin + first + FRAME_HEADER + fs * np.arange(len(pages), dtype=np.int64)
            if pages.max() >= len(self.latest):
                self.latest = _grown(self.latest, int(pages.max()) + 1, -1)
            before = self.latest[pages]
            self.latest[pages] = at
            if (self.latest[pages] != at).any():  # a page twice: in order
                self.latest[pages] = before
                for i, page in enumerate(pages.tolist()):
                    before[i] = self.latest[page]
                    self.latest[page] = at[i]
            ended = np.flatnonzero(commits)
            if len(ended):
                self.npages = int(commits[ended[-1]])
            yield begin, data, pages, before

    def worth_patching(self, data: bytes | memoryview, pages: np.ndarray,
                       before: np.ndarray, db_pages: int,
                       min_bytes: int = PATCH_MIN_BYTES) -> bool:
        """Whether a piece is worth a patch: big enough, and most of its frames have a
        version before them (a patch of pages new to the database only compresses
        them: cheaper recorded whole)."""
        if len(data) < min_bytes:
            return False
        return bool(((before >= 0) | (pages <= db_pages)).sum() * 2 >= len(pages))

    def last_pages(self) -> np.ndarray:
        """The pages (numbers) with a frame in this WAL that the database holds as of
        the last transaction: those a checkpoint copies."""
        self._note()
        return np.flatnonzero(self.latest[:self.npages + 1] >= 0)

    def copies(self) -> bytes:
        """A checkpoint's copies, packed as `COPY` has them: (WAL offset, database
        offset) of each page's last frame, in WAL order, for the pages the database
        holds as of the last transaction (SQLite's checkpoint leaves out the pages past
        its end)."""
        pages = self.last_pages()  # (all frames noted)
        at = self.latest[pages]
        order = np.argsort(at)
        pairs = np.empty(len(at), COPY_PAIR_DTYPE)
        pairs["source"] = at[order]
        pairs["offset"] = (pages[order] - 1) * self.page_size
        return pairs.tobytes()

    def patch(self, data: bytes | memoryview, start: int, pages: np.ndarray,
              before: np.ndarray, wal: Mapped, wal_fnode: int, db: np.ndarray,
              db_fnode: int, held: np.ndarray | None = None
              ) -> tuple[memoryview, set[int]]:
        """`data` (the WAL's bytes at `start`, whole frames, as `read(room=True)` gave
        them with `pages` and `before`) told as a patch, made in `data`'s buffer: its
        frames XORed in place with their versions before, its count and blocks written
        in the room before them. Returns the patch's parts, laid out
        (`ops.packed_patch`), and the fnodes its blocks read. `db`: the database file's
        pages (rows); `held`: which of them the log's database holds (by page - 1; None:
        all). Reads the WAL before `start` and `db`: they must not change meanwhile (any
        thread)."""
        body: object = data.obj if isinstance(data, memoryview) else None
        if not isinstance(body, np.ndarray) or body.dtype != np.uint8:
            raise TypeError("WalFrames.patch: data must be a piece as read(room=True) "
                            "gave it")
        room, fs, ps = len(body) - len(data), self.frame_bytes, self.page_size
        first = WAL_HEADER if start == 0 else 0
        n = len(pages)
        count = 2 * n + (1 if first else 0)
        if room != patch_room(count):
            raise ValueError(f"WalFrames.patch: {room} bytes of room for {count} blocks")
        frames = body[room + first:room + first + n * fs].reshape(n, fs)
        in_wal = before >= 0
        if in_wal.any():  # (a version in this piece: the map still has it as it was)
            length = start + len(data)
            frames_before = wal.view(length)[WAL_HEADER:].reshape(-1, fs)
            rows = (before[in_wal] - WAL_HEADER - FRAME_HEADER) // fs
            frames[in_wal, FRAME_HEADER:] ^= frames_before[rows, FRAME_HEADER:]
        in_db = ~in_wal & (pages <= len(db))
        if held is not None:
            in_db[in_db] = held[pages[in_db] - 1]
        if in_db.any():
            frames[in_db, FRAME_HEADER:] ^= db[pages[in_db] - 1]
        body[:room] = 0
        body[:4].view("<u4")[0] = count
        table = body[4:room].view(PATCH_BLOCK_DTYPE)
        blocks = table[1:] if first else table
        if first:
            table[0]["length"] = WAL_HEADER
        blocks["length"][0::2] = FRAME_HEADER
        page_blocks = blocks[1::2]
        page_blocks["length"] = ps
        page_blocks["fnode"][in_wal] = wal_fnode
        page_blocks["offset"][in_wal] = before[in_wal]
        page_blocks["fnode"][in_db] = db_fnode
        page_blocks["offset"][in_db] = (pages[in_db] - 1) * ps
        sources = ({wal_fnode} if in_wal.any() else set()) | \
            ({db_fnode} if in_db.any() else set())
        return body.data, sources


class Image:
    """The database's new file while a rewrite records it, as a player holds it so far:
    the pieces recorded (its first `pages`), and the pages checkpoints copied into it
    meanwhile (anywhere): what patches may read from it."""

    def __init__(self, fnode: int, size: int) -> None:
        self.fnode, self.size = fnode, size  # (`size`: the database's, where it began)
        self.pages = 0
        self._copied = np.zeros(0, bool)

    def copied(self, pages: np.ndarray) -> None:
        """`pages` (numbers) copied into it by a checkpoint."""
        if len(pages) and pages.max() > len(self._copied):
            self._copied = _grown(self._copied, int(pages.max()), False)
        self._copied[pages - 1] = True

    def held(self, db_pages: int) -> np.ndarray:
        """Which of the database's first `db_pages` pages it holds (by page - 1)."""
        held = np.zeros(db_pages, bool)
        held[:self.pages] = True
        copied = self._copied[:db_pages]
        held[:len(copied)] |= copied
        return held
