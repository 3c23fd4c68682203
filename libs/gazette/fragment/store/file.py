"""``file:///sub/dir/`` stores: a folder under the broker's ``--broker.file-root``.

The URL's path is relative to the file root (``file:///`` is the root itself) and may be
percent-encoded (``file:///my%20store/`` is the folder ``my store``); it never reaches
outside the root, not even through a symlink. This is the store of the tutorial and of
tests: a local directory standing in for a BLOB store.

Blocking file calls (open, read, write, fsync, directory walks) run in worker threads, so
a slow or hung disk never stalls the event loop. A put writes a hidden temporary file in
the fragment's folder (``.gz-put-*``), fsyncs it, renames it over the fragment's name and
fsyncs the folder: readers and listings see the whole fragment or none of it. Temporary
files left by a crash are skipped by listings but not cleaned up. Removing a fragment
leaves its (possibly empty) folders in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import shutil
import urllib.parse
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from gazette.fragment.fragment import Fragment
from gazette.fragment.store.base import (
    CHUNK_SIZE,
    FragmentNotFound,
    FragmentStore,
    Payload,
    PutData,
    SealedFile,
    StoreError,
    check_range,
    not_a_store,
    object_path,
    split_put_data,
)
from gazette.protocol import validate_store_url

#: Name prefix of the temporary files of puts in progress (hidden, never a fragment name).
TEMP_PREFIX = ".gz-put-"


class FileStore(FragmentStore):
    """Fragments as files under ``file_root / <url path>``."""

    def __init__(self, url: str, file_root: Path) -> None:
        validate_store_url(url, "store")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "file":
            raise not_a_store(url, "not a file:// store")
        self.url = url
        #: The broker's file root, resolved.
        self.file_root = Path(file_root).resolve()
        #: This store's folder (it need not exist yet: puts create it).
        self.root = (self.file_root / urllib.parse.unquote(parts.path).lstrip("/")).resolve()
        if not self.root.is_relative_to(self.file_root):
            raise not_a_store(url, f"resolves to {self.root}, outside the file root "
                              f"{self.file_root}")

    def path_of(self, fragment: Fragment) -> Path:
        """The file of `fragment` in this store."""
        return self.root / object_path(fragment)

    def _error(self, op: str, obj: str, exc: OSError) -> StoreError:
        cls = FragmentNotFound if isinstance(exc, FileNotFoundError) else StoreError
        return cls(self.url, op, obj, f"{type(exc).__name__}: {exc}")

    async def list_paths(self, prefix: str) -> list[tuple[str, int]]:
        folder = self.root / prefix.rpartition("/")[0]
        try:
            found = await asyncio.to_thread(_walk, self.root, folder)
        except OSError as exc:
            raise StoreError(self.url, "list", prefix or "/",
                             f"{type(exc).__name__}: {exc}") from exc
        return [(path, mtime) for path, mtime in found if path.startswith(prefix)]

    async def get(self, fragment: Fragment, begin: int = 0,
                  end: int | None = None) -> AsyncIterator[bytes]:
        check_range(begin, end)
        path = self.path_of(fragment)
        try:
            fd = await _open_for_reading(path)
        except OSError as exc:
            raise self._error("get", fragment.path, exc) from exc
        try:
            pos = begin
            while end is None or pos < end:
                n = CHUNK_SIZE if end is None else min(CHUNK_SIZE, end - pos)
                try:
                    chunk = await asyncio.to_thread(os.pread, fd, n, pos)
                except OSError as exc:
                    raise self._error("get", fragment.path, exc) from exc
                if not chunk:
                    return
                pos += len(chunk)
                yield chunk
        finally:
            os.close(fd)

    async def put(self, fragment: Fragment, data: PutData) -> None:
        path = self.path_of(fragment)
        payload, source = split_put_data(data)
        link = isinstance(data, SealedFile)
        try:
            await asyncio.to_thread(_write_atomically, path, payload, source, link)
        except OSError as exc:
            if (source is not None and exc.filename is not None
                    and os.fspath(exc.filename) == os.fspath(source)):
                reason = f"cannot read the local file {source}: {exc.strerror}"
            else:
                reason = f"{type(exc).__name__}: {exc}"
            raise StoreError(self.url, "put", fragment.path, reason) from exc

    async def exists(self, fragment: Fragment) -> bool:
        try:
            return await asyncio.to_thread(self.path_of(fragment).is_file)
        except OSError as exc:
            raise self._error("exists", fragment.path, exc) from exc

    async def remove(self, fragment: Fragment) -> None:
        try:
            await asyncio.to_thread(self.path_of(fragment).unlink, missing_ok=True)
        except OSError as exc:
            raise self._error("remove", fragment.path, exc) from exc

    async def sign(self, fragment: Fragment, ttl: timedelta) -> str:
        """A ``file://`` URL of the fragment's absolute path. Only useful to clients on
        this machine (or sharing this file system at the same path); `ttl` is ignored."""
        return self.path_of(fragment).as_uri()


async def _open_for_reading(path: Path) -> int:
    """A read-only fd of `path`, opened in a worker thread; closed again if we are
    cancelled while the thread opens it (so that no fd leaks)."""
    opening = asyncio.ensure_future(
        asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_CLOEXEC))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


def _close_opened(opening: asyncio.Future[int]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        os.close(opening.result())


def _write_atomically(path: Path, payload: Payload | None, source: Path | None,
                      link: bool = False) -> None:
    """Write `payload` (or copy `source`, or with `link` hard-link it where the file
    system allows) to a temp file beside `path`, fsync it, rename it to `path` and fsync
    the folder, so `path` is absent or whole, even across a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TEMP_PREFIX}{secrets.token_hex(8)}-{path.name}"
    linked = link and source is not None and _link(source, tmp)
    try:
        if linked:
            os.chmod(tmp, FILE_MODE)  # (a spool is 0600; a copy gets 0666 less the umask)
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            # Not mkstemp: its 0600 mode would hide fragments from other local readers
            # of the signed file:// URLs; with 0666 the process umask decides.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            with open(fd, "wb") as out:
                if payload is not None:
                    out.write(payload)
                elif source is not None:
                    with open(source, "rb") as src:
                        _copy_file(src, out)
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _umask() -> int:
    """This process' umask, read without changing it (os.umask would, racing threads)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


#: The mode of a stored fragment: what a new file of mode 0666 gets (see `put`).
FILE_MODE = 0o666 & ~_umask()


def _link(source: Path, tmp: Path) -> bool:
    """Hard-link `source` as `tmp` (no byte copied, nor written to disk twice); False
    where the file systems cannot (another file system, or links not supported)."""
    try:
        os.link(source, tmp)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP,
                         errno.EOPNOTSUPP):
            return False
        raise
    return True


def _copy_file(src: BinaryIO, out: BinaryIO) -> None:
    """Copy `src` to `out` in the kernel (copy_file_range: no bytes through this process,
    which would hold the GIL between reads and writes), or by reads and writes where the
    file systems cannot."""
    try:
        while os.copy_file_range(src.fileno(), out.fileno(), 1 << 30):
            pass
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        out.seek(0)
        out.truncate()
        src.seek(0)
        shutil.copyfileobj(src, out, CHUNK_SIZE)


def _fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where folders cannot be fsynced)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _walk(root: Path, folder: Path) -> list[tuple[str, int]]:
    """(path relative to the store, mtime) of every file under `folder`, recursively,
    except temporary files of puts in progress."""
    out: list[tuple[str, int]] = []
    pending = [folder]
    while pending:
        current = pending.pop()
        try:
            with os.scandir(current) as scan:
                entries = list(scan)
        except (FileNotFoundError, NotADirectoryError):
            continue  # nothing stored yet, or removed meanwhile
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif not entry.name.startswith(TEMP_PREFIX) and entry.is_file():
                    mtime = int(entry.stat().st_mtime)
                    out.append((Path(entry.path).relative_to(root).as_posix(), mtime))
            except FileNotFoundError:
                continue  # removed while we looked
    return out
