"""Spools: the fragment a broker is appending to, on local disk.

An append writes its chunks into the spool as they arrive and becomes part of the
journal only at `commit()`; `rollback()` (a client that disconnected mid-append, a failed
replication) truncates the file and restores the running SHA-1, so an aborted append
leaves nothing behind. The spool rolls to a new fragment at the spec's length, after its
flush interval, or on demand; a closed spool is a `Fragment` plus its local file, which
the `Persister` uploads.

Writes are plain `os.pwrite` on the caller's thread: a broker writes an append's large
chunks on a thread of its own, in order (`gazette.fragment.summer.ThreadedSha1`'s
`write`), small ones on the loop. The SHA-1s are summed by the caller (`summed=True`),
on a worker thread for large chunks (`gazette.fragment.summer`). Reads of the open
spool come from the page cache on the loop (`read_cached`, which never waits for the
disk). What may block runs in worker threads: creating and removing spool files
(`create`, `remove`), and reads the page cache cannot serve (`read_file`, which opens
the file by path, so a spool closed meanwhile is never read through a reused
descriptor).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from gazette.fragment.fragment import Fragment
from gazette.protocol import CompressionCodec, FragmentSpec

#: Reads that never wait for the disk (Linux 4.14+); 0 elsewhere: then they may.
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


@dataclass(frozen=True, slots=True)
class ClosedSpool:
    """A rolled spool: its fragment and the local file holding its (raw) content."""

    fragment: Fragment
    path: Path


class Spool:
    """The open fragment of one journal, from offset `begin`."""

    def __init__(self, journal: str, begin: int, directory: Path,
                 codec: CompressionCodec = CompressionCodec.NONE,
                 file: tuple[int, Path] | None = None) -> None:
        """A new spool file in `directory` (or `file`: one made already, by `create`)."""
        self.journal, self.begin, self.codec = journal, begin, codec
        if file is None:
            fd, name = tempfile.mkstemp(prefix="spool-", dir=directory)
            file = fd, Path(name)
        self._fd, self.path = file
        self._committed = begin  # offset through which content is committed
        self._sha1 = hashlib.sha1()  # over committed content
        self._pending_sha1: hashlib._Hash | None = None
        self._written = begin  # offset through which bytes are written (incl. pending)
        self.first_append_at: float | None = None

    @classmethod
    async def create(cls, journal: str, begin: int, directory: Path,
                     codec: CompressionCodec = CompressionCodec.NONE) -> Spool:
        """A new spool, its file made in a worker thread (a slow disk never stalls the
        loop)."""
        fd, name = await asyncio.to_thread(tempfile.mkstemp, prefix="spool-", dir=directory)
        return cls(journal, begin, directory, codec, (fd, Path(name)))

    @property
    def end(self) -> int:
        """Offset one past the last committed byte."""
        return self._committed

    @property
    def written(self) -> int:
        """Offset one past the last byte written (the append in progress included)."""
        return self._written

    @property
    def pending(self) -> Fragment:
        """The fragment the spool becomes if the append in progress commits."""
        return Fragment(self.journal, self.begin, self._written,
                        self.pending_sum.digest(), self.codec)

    @property
    def fragment(self) -> Fragment:
        """The fragment of the committed content so far."""
        return Fragment(self.journal, self.begin, self._committed, self._sha1.digest(),
                        self.codec)

    def write(self, chunk: bytes | memoryview, *, summed: bool = False) -> None:
        """Write a chunk of the append in progress. `summed`: the caller sums it into
        `pending_sum` itself (on a worker thread, say), and before `commit()`."""
        pending = self.pending_sum
        view = memoryview(chunk)
        while view:
            n = os.pwrite(self._fd, view, self._written - self.begin)
            view = view[n:]
            self._written += n
        if not summed:
            pending.update(chunk)

    @property
    def pending_sum(self) -> hashlib._Hash:
        """The running SHA-1 of the committed content and the append in progress."""
        if self._pending_sha1 is None:
            self._pending_sha1 = self._sha1.copy()
        return self._pending_sha1

    def commit(self) -> Fragment:
        """Make the append in progress part of the journal; returns the spool's fragment."""
        if self._pending_sha1 is not None:
            self._sha1, self._pending_sha1 = self._pending_sha1, None
            self._committed = self._written
            if self.first_append_at is None:
                self.first_append_at = time.monotonic()
        return self.fragment

    def rollback(self) -> None:
        """Discard the append in progress, as if it never started."""
        self._pending_sha1 = None
        if self._written != self._committed:
            os.ftruncate(self._fd, self._committed - self.begin)
            self._written = self._committed

    def read(self, offset: int, size: int) -> bytes:
        """Committed content from `offset` (at most `size` bytes)."""
        if not self.begin <= offset <= self._committed:
            raise ValueError(f"offset {offset} outside spool [{self.begin}, {self._committed})")
        size = min(size, self._committed - offset)
        return os.pread(self._fd, size, offset - self.begin) if size > 0 else b""

    def read_cached(self, offset: int, size: int) -> bytearray | None:
        """Committed content from `offset` (at most `size` bytes) if the page cache holds
        it, without ever waiting for the disk (``RWF_NOWAIT``): a read on the event loop
        that cannot block it. None where the disk would have to be read (read it in a
        worker thread, with `read_file`); fewer bytes where only some are cached."""
        if not self.begin <= offset <= self._committed:
            raise ValueError(f"offset {offset} outside spool [{self.begin}, {self._committed})")
        size = min(size, self._committed - offset)
        if size <= 0:
            return bytearray()
        buf = bytearray(size)
        try:
            n = os.preadv(self._fd, [buf], offset - self.begin, _NOWAIT)
        except BlockingIOError:
            return None
        if n <= 0:
            return None
        del buf[n:]
        return buf

    def should_roll(self, spec: FragmentSpec, now: float | None = None) -> bool:
        """Whether the spool reached the spec's length or outlived its flush interval."""
        if self._committed - self.begin >= spec.length:
            return True
        if spec.flush_interval > timedelta(0) and self.first_append_at is not None:
            now = time.monotonic() if now is None else now
            return now - self.first_append_at >= spec.flush_interval.total_seconds()
        return False

    def close(self) -> ClosedSpool:
        """Stop appending: any append in progress is rolled back."""
        self.rollback()
        fragment = self.fragment
        os.close(self._fd)
        return ClosedSpool(fragment, self.path)

    def discard(self) -> None:
        """Close and delete (an empty spool, or one already persisted)."""
        os.close(self._fd)
        self.path.unlink(missing_ok=True)

    async def remove(self) -> None:
        """`discard`, the file removed in a worker thread."""
        os.close(self._fd)
        await asyncio.to_thread(self.path.unlink, missing_ok=True)


def read_file(path: Path, offset: int, size: int) -> bytes:
    """`size` bytes (fewer at the end) of the file at `path` from `offset` (blocking: for
    a worker thread). Raises FileNotFoundError once the file is gone (persisted)."""
    with open(path, "rb", buffering=0) as fh:
        return os.pread(fh.fileno(), size, offset)
