"""`RecordedFolder`: a store's local folder whose every change is recorded.

A store (a JSON file, SQLite through `gazette.consumer.sqlite`'s VFS, or a key/value
engine with a pluggable file layer) makes its file changes through this: each one is
made on the local file first, then recorded (`Recorder`), in the order it happened, so
the log replays to a state the folder passed through. `commit()` makes what was
recorded durable. Local fsyncs are not needed (the log is what is durable: the folder is
rebuilt from it on any member), so there is no `sync`.

Names are relative to the folder (``a.db``, ``sub/b.json``); the played folder a
`Player` hands off from already holds the files the log names.
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path, PurePosixPath

from gazette.errors import ValidationError
from gazette.recoverylog.fsm import Hints
from gazette.recoverylog.recorder import Recorder, Sealed
from gazette.supervise import settle


def _relative(name: str) -> str:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or str(path) != name:
        raise ValidationError("file name", f"{name!r} is not a plain relative name in "
                              "the store's folder")
    return name


class RecordedFile:
    """An open file of the folder: `pwrite` and `truncate` are recorded."""

    def __init__(self, folder: RecordedFolder, name: str, fd: int, fnode: int) -> None:
        self.folder, self.name, self.fd, self.fnode = folder, name, fd, fnode

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)
        self.folder.recorder.write(self.fnode, offset, data)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.folder.recorder.truncate(self.fnode, size)

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RecordedFolder:
    """The folder `root`, recorded by `recorder`. Its methods may be called from worker
    threads (a store's engine may run there): the recorder serializes recording."""

    def __init__(self, root: Path, recorder: Recorder) -> None:
        self.root, self.recorder = root, recorder
        #: Hints of the log as the last commit left it (None: none yet).
        self.hints: Hints | None = None
        #: Set when landed hints start later in the log than those before (the store
        #: rewrote its files): the older stretch can be pruned once they are stored.
        self.moved = asyncio.Event()

    def path(self, name: str) -> Path:
        return self.root / _relative(name)

    def exists(self, name: str) -> bool:
        return self.recorder.fnode(_relative(name)) is not None

    def open(self, name: str, *, truncate: bool = False) -> RecordedFile:
        """Open `name`, creating it (recorded) if the log has no such file."""
        path = self.path(name)
        with self.recorder.lock:  # one creation of a file that is not there yet
            fnode = self.recorder.fnode(name)
            if fnode is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                fnode = self.recorder.create(name)
                return RecordedFile(self, name, fd, fnode)
        fd = os.open(path, os.O_RDWR)
        file = RecordedFile(self, name, fd, fnode)
        if truncate:
            file.truncate(0)
        return file

    def unlink(self, name: str) -> None:
        os.unlink(self.path(name))
        self.recorder.unlink(name)

    def rename(self, src: str, dst: str) -> None:
        """`src` takes the place of `dst` (atomically, as `os.replace`)."""
        os.replace(self.path(src), self.path(dst))
        self.recorder.rename(src, _relative(dst))

    def replace(self, name: str, data: bytes) -> None:
        """`name` holds `data` whole: written as a new file renamed over it, so a log
        played to any point holds the old content or the new, never a mix."""
        tmp = name + ".tmp"
        if self.exists(tmp):
            self.unlink(tmp)
        file = self.open(tmp)
        try:
            file.pwrite(data, 0)
        finally:
            file.close()
        self.rename(tmp, name)

    def read(self, name: str) -> bytes | None:
        """The content of `name` (None: the log has no such file)."""
        if not self.exists(name):
            return None
        return self.path(name).read_bytes()

    async def commit(self) -> None:
        """Make what was recorded so far durable (`Recorder.commit`)."""
        await self.land(self.recorder.seal(hints=True))

    async def land(self, sealed: Sealed) -> None:
        """Make a sealed commit durable (`Recorder.land`); its hints, if it has them,
        become the folder's."""
        self._took(await self.recorder.land(sealed))

    def landing(self, sealed: Sealed) -> asyncio.Future[None]:
        """`land(sealed)` without a task (one less for each of a store's commits): a
        future done once it landed. Its last frame must be encoded (`Sealed.tail`)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def took(landed: asyncio.Future[None]) -> None:
            if not landed.cancelled() and landed.exception() is None:
                self._took(sealed.hints)

        landed = self.recorder.release(sealed)
        landed.add_done_callback(took)  # (first: the hints are the folder's when done is)
        landed.add_done_callback(functools.partial(settle, done))
        return done

    def _took(self, hints: Hints | None) -> None:
        """A landed commit's hints, if it has them, become the folder's."""
        if hints is not None and (self.hints is None or hints.through >= self.hints.through):
            if self.hints is not None and hints.first_offset() > self.hints.first_offset():
                self.moved.set()
            self.hints = hints
