"""A local cache of persisted fragments, verified before anything is served from it.

Reading a persisted fragment streams it from its store through the codec into a temp
file while hashing the content; only if the SHA-1 matches is the file renamed into the
cache (named by the SHA-1) and served. A corrupt fragment raises `CorruptFragment` and
leaves nothing in the cache, so it is reported, never served as good. Decompression runs
as chunks arrive, so memory stays bounded whatever the fragment's size.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path

from gazette.fragment.codec import FragmentDecoder
from gazette.fragment.fragment import Fragment
from gazette.fragment.store.base import FragmentStore


class FragmentCache:
    """Verified, decompressed copies of persisted fragments in `directory`."""

    def __init__(self, directory: Path, max_bytes: int = 4 << 30) -> None:
        self.directory = directory
        #: Past this many bytes, the least recently fetched fragments are evicted.
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._fetching: dict[bytes, asyncio.Task[Path]] = {}

    def path(self, fragment: Fragment) -> Path:
        return self.directory / f"{fragment.sha1.hex()}-{fragment.size}"

    async def get(self, store: FragmentStore, fragment: Fragment) -> Path:
        """The local file of `fragment`'s content, fetching and verifying it if needed
        (concurrent readers of one fragment share one fetch)."""
        path = self.path(fragment)
        if path.exists():
            return path
        task = self._fetching.get(fragment.sha1)
        if task is None:
            task = asyncio.ensure_future(self._fetch(store, fragment, path))
            self._fetching[fragment.sha1] = task
            task.add_done_callback(lambda _: self._fetching.pop(fragment.sha1, None))
        return await asyncio.shield(task)

    async def _fetch(self, store: FragmentStore, fragment: Fragment, path: Path) -> Path:
        fd, tmp = tempfile.mkstemp(prefix=".fetch-", dir=self.directory)
        try:
            # Undecodable input, content past the fragment's length or not matching its
            # SHA-1: CorruptFragment naming it (the temp file is removed below).
            decoder = FragmentDecoder(fragment)

            def take(chunk: bytes | None) -> None:
                """Decompress, hash and write a chunk (None: the end), off the loop:
                decompression and SHA-1 of a large fragment would stall it."""
                _write_all(fd, decoder.feed(chunk) if chunk is not None else decoder.finish())

            async for chunk in store.get(fragment):
                await asyncio.to_thread(take, chunk)
            await asyncio.to_thread(take, None)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
            await asyncio.to_thread(self._evict, path)
            return path
        finally:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _evict(self, keep: Path) -> None:
        """Remove the oldest cached fragments until the cache fits `max_bytes`."""
        files = []
        for p in self.directory.iterdir():
            if p.name.startswith(".fetch-") or p == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                files.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in files) + keep.stat().st_size
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            total -= size


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
