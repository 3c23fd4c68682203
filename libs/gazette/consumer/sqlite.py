"""`SQLiteStore`: a shard's state in a SQLite database on the member's disk, made
durable by the shard's recovery log.

The database is opened through an `apsw` VFS that records every write and truncation
of the database file and its write-ahead log, and every file it creates or deletes, into
the shard's recovery log (`gazette.recoverylog.RecordedFolder`). A consumer transaction
is one SQLite transaction (always open: the application runs its statements through
`db` as messages arrive); its commit writes the checkpoint into the same SQLite
transaction, commits it locally, and is durable once the log append holding those
writes is acknowledged (after the transaction's own publishes: `wait_for`). A crash at
any point leaves a log whose files are ones SQLite itself recovers from (the log replays
a prefix of the writes, in order), and a new primary rebuilds the folder from the log.

Local fsyncs are skipped (the log is what is durable). The database runs in WAL mode
with exclusive locking (no shared-memory file; one connection per store). Use `db` from
the event loop's thread, or one worker thread at a time.

A key/value engine with a pluggable file layer (RocksDB's Env, LMDB's is not) is added
the same way: route its file writes through `RecordedFolder`.

The checkpoint table::

    CREATE TABLE gazette_checkpoint (id INTEGER PRIMARY KEY CHECK (id = 0),
                                     checkpoint BLOB NOT NULL)
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Sequence
from typing import Any

import apsw

from gazette.consumer.checkpoint import Checkpoint
from gazette.consumer.store import _after
from gazette.errors import GazetteError
from gazette.recoverylog import RecordedFolder

#: The files of a database that are recorded: the database, its rollback journal, its
#: WAL (temporary files and statement journals are not: they never outlive a session).
_RECORDED = apsw.SQLITE_OPEN_MAIN_DB | apsw.SQLITE_OPEN_MAIN_JOURNAL | apsw.SQLITE_OPEN_WAL
_names = itertools.count(1)


class _RecordedFile(apsw.VFSFile):
    def __init__(self, vfs: _RecordingVFS, name: Any, flags: list[int]) -> None:
        super().__init__("", name, flags)
        self.recorded = vfs.folder
        self.fnode = vfs.fnode_of(name, flags[0])

    def xWrite(self, data: Any, offset: int) -> None:
        super().xWrite(data, offset)
        if self.fnode:
            self.recorded.recorder.write(self.fnode, offset, data)

    def xTruncate(self, newsize: int) -> None:
        super().xTruncate(newsize)
        if self.fnode:
            self.recorded.recorder.truncate(self.fnode, newsize)

    def xSync(self, flags: int) -> None:
        """The recovery log is what is durable: no local fsync."""


class _RecordingVFS(apsw.VFS):
    """The default VFS, with the database's files recorded into `folder`."""

    def __init__(self, folder: RecordedFolder) -> None:
        self.folder = folder
        self.root = os.path.realpath(folder.root)
        self.vfs_name = f"gazette-recorded-{next(_names)}"
        super().__init__(self.vfs_name, base="")

    def _relative(self, name: Any) -> str | None:
        if name is None:
            return None
        path = os.path.realpath(name.filename() if isinstance(name, apsw.URIFilename)
                                else str(name))
        rel = os.path.relpath(path, self.root)
        return None if rel.startswith("..") else rel

    def fnode_of(self, name: Any, flags: int) -> int:
        """The fnode of a file SQLite opens (0: not recorded); its creation recorded."""
        rel = self._relative(name) if flags & _RECORDED else None
        if rel is None:
            return 0
        recorder = self.folder.recorder
        with recorder.lock:
            fnode = recorder.fnode(rel)
            return fnode if fnode is not None else recorder.create(rel)

    def xOpen(self, name: Any, flags: list[int]) -> _RecordedFile:
        return _RecordedFile(self, name, flags)

    def xDelete(self, filename: str, syncdir: bool) -> None:
        super().xDelete(filename, syncdir)
        rel = self._relative(filename)
        if rel is not None and self.folder.recorder.fnode(rel) is not None:
            self.folder.recorder.unlink(rel)


class SQLiteStore:
    """The database `name` in the shard's recorded folder (`Shard.folder`)."""

    def __init__(self, folder: RecordedFolder | None, name: str = "store.db", *,
                 cache_pages: int = 2000, checkpoint_pages: int = 10_000) -> None:
        """`checkpoint_pages`: the WAL's size (in pages) at which SQLite copies it into
        the database (`wal_autocheckpoint`). Both copies are recorded: checkpointing
        seldom copies a page changed by many transactions once, not once each."""
        if folder is None:
            raise GazetteError("SQLiteStore needs the shard's recovery log: give the "
                               "shard a recovery_log_prefix (and a hint_prefix)")
        self.folder, self.name, self.cache_pages = folder, name, cache_pages
        self.checkpoint_pages = checkpoint_pages
        self._vfs: _RecordingVFS | None = None
        self._db: apsw.Connection | None = None

    @property
    def db(self) -> apsw.Connection:
        """The connection; its transaction is the open consumer transaction's."""
        if self._db is None:
            raise RuntimeError("SQLiteStore: restore_checkpoint() first")
        return self._db

    async def restore_checkpoint(self) -> Checkpoint:
        """Open the database (as played from the log), make the checkpoint table if
        missing, and return the checkpoint; a transaction is open from here on."""
        self._vfs = _RecordingVFS(self.folder)
        db = self._db = apsw.Connection(str(self.folder.path(self.name)),
                                        vfs=self._vfs.vfs_name)
        db.setbusytimeout(0)
        for pragma in ("locking_mode=EXCLUSIVE", "journal_mode=WAL", "synchronous=OFF",
                       f"cache_size={int(self.cache_pages)}",
                       f"wal_autocheckpoint={int(self.checkpoint_pages)}"):
            db.execute(f"PRAGMA {pragma}")
        db.execute("CREATE TABLE IF NOT EXISTS gazette_checkpoint (id INTEGER PRIMARY "
                   "KEY CHECK (id = 0), checkpoint BLOB NOT NULL)")
        row = db.execute("SELECT checkpoint FROM gazette_checkpoint").fetchone()
        await self.folder.commit()
        db.execute("BEGIN")
        return Checkpoint.decode(bytes(row[0])) if row else Checkpoint()

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]:
        """Commit the open transaction with `checkpoint` locally at once (the next one
        begins), durable once its log append (after `wait_for`) is acknowledged."""
        db = self.db
        db.execute("INSERT OR REPLACE INTO gazette_checkpoint VALUES (0, ?)",
                   (checkpoint.encode(),))
        db.execute("COMMIT")
        db.execute("BEGIN")

        async def commit() -> None:
            await _after(wait_for)
            await self.folder.commit()

        return asyncio.ensure_future(commit())

    async def close(self) -> None:
        """Close, without committing the open transaction (nothing more is recorded:
        closing may checkpoint the WAL, which the next primary replays for itself)."""
        db, self._db = self._db, None
        if db is not None:
            self.folder.recorder.detach()
            db.close(True)
        if self._vfs is not None:
            self._vfs.unregister()
            self._vfs = None
