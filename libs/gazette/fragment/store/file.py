"""``file:///path/`` stores: a folder under the broker's ``--broker.file-root``.

Blocking file calls run in worker threads, so a slow disk never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

from gazette.fragment.fragment import Fragment
from gazette.fragment.index import from_listing
from gazette.fragment.store.base import CHUNK_SIZE, FragmentNotFound, FragmentStore, StoreError


class FileStore(FragmentStore):
    def __init__(self, url: str, file_root: Path) -> None:
        self.url = url
        root = file_root.resolve()
        self.root = (root / url.removeprefix("file://").lstrip("/")).resolve()
        if self.root != root and root not in self.root.parents:
            raise StoreError(url, "open", str(self.root), f"escapes the file root {root}")

    def _path(self, fragment: Fragment) -> Path:
        return self.root / fragment.path

    def _fail(self, op: str, fragment: Fragment, exc: OSError) -> StoreError:
        cls = FragmentNotFound if isinstance(exc, FileNotFoundError) else StoreError
        return cls(self.url, op, fragment.path, str(exc))

    async def list(self, journal: str) -> list[Fragment]:
        def walk() -> list[tuple[str, int]]:
            base = self.root / journal
            found = []
            for folder, _, files in os.walk(base):
                for name in files:
                    full = Path(folder) / name
                    if name.startswith(".tmp-"):
                        continue  # a put in progress
                    found.append((str(full.relative_to(self.root)), int(full.stat().st_mtime)))
            return found

        try:
            paths = await asyncio.to_thread(walk)
        except OSError as exc:
            raise StoreError(self.url, "list", journal, str(exc)) from exc
        return [f for f in from_listing(paths, self.url) if f.journal == journal]

    async def get(self, fragment: Fragment, begin: int = 0,
                  end: int | None = None) -> AsyncIterator[bytes]:
        try:
            fh = await asyncio.to_thread(open, self._path(fragment), "rb")
        except OSError as exc:
            raise self._fail("get", fragment, exc) from exc
        try:
            await asyncio.to_thread(fh.seek, begin)
            left = None if end is None else end - begin
            while left is None or left > 0:
                n = CHUNK_SIZE if left is None else min(CHUNK_SIZE, left)
                chunk = await asyncio.to_thread(fh.read, n)
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk
        except OSError as exc:
            raise self._fail("get", fragment, exc) from exc
        finally:
            fh.close()

    async def put(self, fragment: Fragment, data: bytes) -> None:
        path = self._path(fragment)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)  # atomic: readers see the whole file or none
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            raise self._fail("put", fragment, exc) from exc

    async def exists(self, fragment: Fragment) -> bool:
        return await asyncio.to_thread(self._path(fragment).is_file)

    async def remove(self, fragment: Fragment) -> None:
        try:
            await asyncio.to_thread(self._path(fragment).unlink)
        except OSError as exc:
            raise self._fail("remove", fragment, exc) from exc

    async def sign(self, fragment: Fragment, ttl: timedelta) -> str:
        """A ``file://`` URL of the fragment: useful only to clients on this machine."""
        return self._path(fragment).as_uri()
