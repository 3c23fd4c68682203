"""`SQLiteStore`: a shard's state in a SQLite database on the member's disk, made
durable by the shard's recovery log (docs/recoverylog.md says how and at what cost).

The database runs in WAL mode with exclusive locking and no local fsync, through
SQLite's own file layer. The log holds the database file as of its last *rewrite* and
the WAL's frames after it, each recorded once: at each commit the frames SQLite
appended (its WAL hook counts them), read back, whole or as patches against each
page's version before (`sqlite_wal`); the store's own checkpoints (SQLite runs none)
as the copies they make, which a player runs on its own WAL to the same bytes; and a
rewrite (at creation, and once the log a player needs outgrows 1 + `rewrite_factor`
times the database) as the database, compressed, recorded in the background as a new
file, with the frames meanwhile going to a new WAL, both renamed into place by one
last append: every older segment of the log is dead from there (`gazctl shards
prune`). Commits sealed during a rewrite are durable once that append landed.

A played folder is a database file and a WAL of whole transactions, which SQLite opens
as after a crash. A consumer transaction is one SQLite transaction (always open: the
application runs its statements through `db`); its commit writes the checkpoint into
it, commits locally, seals its frames as the recorder's next commit at once, and is
durable once their log append (after the transaction's publishes: `wait_for`) is
acknowledged. Up to `commits_in_flight` commits may be under way; they land in order.

Use `db` from the event loop's thread, or one worker thread at a time. Do not run
``PRAGMA wal_checkpoint`` or change the journal mode: the store checks at each commit
that the database file is as the log has it, and fails the shard if not. The
checkpoint table::

    CREATE TABLE gazette_checkpoint (id INTEGER PRIMARY KEY CHECK (id = 0),
                                     checkpoint BLOB NOT NULL)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import apsw
import numpy as np

from gazette.consumer.checkpoint import Checkpoint
from gazette.consumer.sqlite_wal import (
    PATCH_MIN_BYTES,
    WAL_HEADER,
    Image,
    Mapped,
    WalFrames,
)
from gazette.consumer.store import _after
from gazette.errors import GazetteError
from gazette.recoverylog import RecordedFolder
from gazette.recoverylog.ops import Kind, compressed
from gazette.recoverylog.recorder import Later, Sealed
from gazette.supervise import retrieved

#: Database bytes read and recorded per write while a rewrite records the database.
REWRITE_CHUNK = 4 << 20
#: Rewrite chunks whose appends are under way at once.
REWRITE_IN_FLIGHT = 4
#: Commits the runner may have under way while a rewrite records the database.
REWRITE_COMMITS = 256
#: While a rewrite records the database, the WAL is checkpointed at this many times
#: `checkpoint_pages` (it stays bounded however long the rewrite takes).
REWRITE_CHECKPOINTS = 10
#: A commit whose frames are being encoded when it reaches `checkpoint_pages` is
#: checkpointed only at this many times it: a checkpoint waits for them (it changes
#: what they read), so fewer, larger ones cost less (measured: random updates ~10%
#: faster than checkpointing each 10,000 frames of 1 KiB).
ENCODING_CHECKPOINTS = 3


class StoreChanged(GazetteError):
    """The database file changed outside a rewrite (a checkpoint the store did not
    run): the log no longer describes it."""


class SQLiteStore:
    """The database `name` in the shard's recorded folder (`Shard.folder`)."""

    def __init__(self, folder: RecordedFolder | None, name: str = "store.db", *,
                 cache_pages: int = 2000, page_size: int = 4096,
                 rewrite_factor: float = 0.75, rewrite_min_bytes: int = 64 << 20,
                 commits_in_flight: int = 32, checkpoint_pages: int = 10_000,
                 patch_pages: bool = True, patch_min_bytes: int = PATCH_MIN_BYTES,
                 compress_rewrites: bool = True) -> None:
        """`page_size` applies to a new database (an existing one keeps its own): the
        smaller the pages, the fewer bytes a scattered update records (1024 records a
        quarter of 4096's for single-row updates, and is as fast here; rows larger than
        about a page then spill to overflow pages). A rewrite comes once the log a
        player needs (the last rewrite's image and what was recorded after it) is over
        `rewrite_min_bytes` and 1 + `rewrite_factor` times the database: a log after
        prune holds about that much, and a database that only grows is not rewritten
        for nothing. `commits_in_flight`: how many commits' log appends may be under
        way at once. `checkpoint_pages`: the WAL's size (in frames) at which the store
        checkpoints it into the database at a commit (recorded as the pages' copies, not
        their bytes: a player runs the same checkpoint). `patch_pages`: record each
        frame as its page's difference from the version before it (`sqlite_wal`), not
        whole, for commits of `patch_min_bytes` of WAL or more. `compress_rewrites`:
        record a rewrite's database compressed (a smaller log, for some CPU)."""
        if folder is None:
            raise GazetteError("SQLiteStore needs the shard's recovery log: give the "
                               "shard a recovery_log_prefix (and a hint_prefix)")
        if page_size not in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):
            raise GazetteError(f"SQLiteStore: page_size {page_size} is not a power of "
                               "two from 512 to 65536")
        for option, value, least in (("rewrite_factor", rewrite_factor, 0.0),
                                     ("commits_in_flight", commits_in_flight, 1),
                                     ("checkpoint_pages", checkpoint_pages, 1),
                                     ("rewrite_min_bytes", rewrite_min_bytes, 0),
                                     ("patch_min_bytes", patch_min_bytes, 0)):
            positive = isinstance(least, float)  # (more than it, not at least)
            if not isinstance(value, int | float) or value < least or \
                    (positive and value == least):
                want = "positive" if positive else f"at least {least}"
                raise GazetteError(f"SQLiteStore: {option} must be a number, {want}, "
                                   f"not {value!r}")
        for option, flag in (("patch_pages", patch_pages),
                             ("compress_rewrites", compress_rewrites)):
            if not isinstance(flag, bool):
                raise GazetteError(f"SQLiteStore: {option} must be true or false, not "
                                   f"{flag!r}")
        self.folder, self.name, self.cache_pages = folder, name, cache_pages
        self._db_path = str(folder.path(name))  # (asked at every commit)
        self.page_size, self.rewrite_factor = page_size, rewrite_factor
        self.rewrite_min_bytes = rewrite_min_bytes
        self.max_commits = commits_in_flight
        self.checkpoint_pages = checkpoint_pages
        self.patch_pages, self.patch_min_bytes = patch_pages, patch_min_bytes
        self.compress_rewrites = compress_rewrites
        self.checkpoints = 0  # checkpoints this store ran (and recorded)
        self.rewrites = 0  # rewrites this store made (its creation's included)
        self.wal_recorded = 0  # WAL bytes it recorded
        self._db: apsw.Connection | None = None
        self._wal_fd = -1
        self._frames = 0  # WAL frames SQLite holds, as its WAL hook last said
        self._wal_end = 0  # WAL bytes recorded
        self._since_rewrite = 0  # log bytes recorded since the last rewrite (or open)
        #: The log a player needs as of the last rewrite (its image, compressed) or the
        #: open.
        self._live_at = 0
        self._db_stat: tuple[int, int] = (0, 0)
        #: The rewrite under way (its image being recorded), and what it resolves once
        #: its final rename landed (then None): commits sealed after it began are
        #: durable then. A failed one stays, and fails every later commit: their frames
        #: went to a WAL file the log never renamed into place.
        self._rewriting: asyncio.Task[None] | None = None
        self._rewritten: asyncio.Future[None] | None = None
        self._wal_fnode = 0  # the fnode the WAL's frames are recorded into
        self._wal_frames = WalFrames(4096)  # (of the database's page size once open)
        #: While a rewrite records the database: the new file as recorded so far.
        self._image = Image(0, 0)
        #: The database file and the WAL, mapped (patches read the versions before
        #: there), and the database's size in pages as of its last change.
        self._db_map: Mapped | None = None
        self._wal_map: Mapped | None = None
        self._db_pages = 0

    @property
    def db(self) -> apsw.Connection:
        """The connection; its transaction is the open consumer transaction's."""
        if self._db is None:
            raise RuntimeError("SQLiteStore: restore_checkpoint() first")
        return self._db

    @property
    def rewriting(self) -> bool:
        return self._rewriting is not None and not self._rewriting.done()

    @property
    def commits_in_flight(self) -> int:
        """How many commits the runner may have under way (asked each transaction):
        while a rewrite records the database, commits sealed after it began wait for
        it, and the runner goes on (`REWRITE_COMMITS`)."""
        return REWRITE_COMMITS if self.rewriting else self.max_commits

    @property
    def path(self) -> Path:
        return self.folder.path(self.name)

    @property
    def _wal(self) -> str:
        return self.name + "-wal"

    async def restore_checkpoint(self) -> Checkpoint:
        """Open the database (as played from the log), make the checkpoint table if
        missing, and return the checkpoint; a transaction is open from here on."""
        rewrite, row = self._open()
        if rewrite:
            await self._rewrite(self._begin_rewrite())
        else:
            await self.folder.commit()
        self.db.execute("BEGIN")
        return Checkpoint.decode(bytes(row[0])) if row else Checkpoint()

    def _open(self) -> tuple[bool, Any]:
        """Open the database; (whether it must be rewritten first, the checkpoint row)."""
        folder, path = self.folder, self.path
        for leftover in (self.name + ".rewrite", self._wal + ".rewrite"):  # cut short
            if folder.exists(leftover):
                folder.path(leftover).unlink(missing_ok=True)
                folder.recorder.unlink(leftover)
        fresh = not folder.exists(self.name)
        if fresh:  # nothing of a database the log does not hold
            for suffix in ("", "-wal", "-journal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)
        db = self._db = apsw.Connection(str(path))
        db.setbusytimeout(0)
        db.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
        pragmas = [f"page_size={int(self.page_size)}"] if fresh else []
        for pragma in (*pragmas, "locking_mode=EXCLUSIVE", "journal_mode=WAL",
                       "synchronous=OFF", f"cache_size={int(self.cache_pages)}",
                       "wal_autocheckpoint=0"):
            db.execute(f"PRAGMA {pragma}")
        self._wal_frames = WalFrames(_one(db, "PRAGMA page_size"))
        db.set_wal_hook(self._on_wal)
        wal_end = None if fresh or not folder.exists(self._wal) else \
            self._wal_frames.valid_end(self._wal_path)
        rewrite = wal_end is None
        if wal_end is not None:
            self._wal_end = wal_end
            self._frames = (wal_end - WAL_HEADER) // self._wal_frames.frame_bytes \
                if wal_end else 0
        db.execute("CREATE TABLE IF NOT EXISTS gazette_checkpoint (id INTEGER PRIMARY "
                   "KEY CHECK (id = 0), checkpoint BLOB NOT NULL)")
        row = db.execute("SELECT checkpoint FROM gazette_checkpoint").fetchone()
        if not rewrite:
            self._open_wal()
            self._db_stat = self._stat()
            recorder = folder.recorder
            self._live_at = recorder.head - recorder.fsm.hints(recorder.log).first_offset()
            self._wal_fnode = recorder.fnode(self._wal) or 0
            for _ in self._wal_frames.read(self._wal_fd, 0, self._wal_end, REWRITE_CHUNK):
                pass  # (its frames noted)
            self._record_wal()
        return rewrite, row

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]:
        """Commit the open transaction with `checkpoint` locally at once and seal its
        WAL frames as the recorder's next commit (the next transaction begins at once);
        durable once their log append (after `wait_for`) is acknowledged, and, if a
        rewrite was under way when it was sealed, once that rewrite landed."""
        db = self.db
        db.execute("INSERT OR REPLACE INTO gazette_checkpoint VALUES (0, ?)",
                   (checkpoint.encode(),))
        db.execute("COMMIT")
        self._check_db()
        self._record_wal()
        if self.rewriting:  # (less often: its copies wait for the log; none if shrunk)
            if self._frames >= REWRITE_CHECKPOINTS * self.checkpoint_pages and \
                    self._wal_frames.npages * self._wal_frames.page_size >= self._image.size:
                self._checkpoint()
        elif self._frames >= self.checkpoint_pages and (
                not self.folder.recorder.encoding or
                self._frames >= ENCODING_CHECKPOINTS * self.checkpoint_pages):
            self._checkpoint()
        sealed = self.folder.recorder.seal(hints=True)
        after = self._rewritten
        if after is None and self._live_at + self._since_rewrite > max(
                self.rewrite_min_bytes, (1 + self.rewrite_factor) * self._db_bytes()):
            image = self._begin_rewrite()
            self._rewriting = asyncio.ensure_future(self._rewrite(image))
            self._rewriting.add_done_callback(retrieved)
        db.execute("BEGIN")
        if not wait_for and after is None and sealed.tail is None:
            return self.folder.landing(sealed)  # (no task: it waits for nothing else)
        return asyncio.ensure_future(self._land(sealed, wait_for, after))

    async def _land(self, sealed: Sealed, wait_for: Sequence[Awaitable[Any]],
                    after: asyncio.Future[None] | None = None) -> None:
        await _after(wait_for)
        await self.folder.land(sealed)
        if after is not None:
            await asyncio.shield(after)

    async def close(self) -> None:
        """Close, without committing the open transaction (nothing more is recorded;
        closing does not checkpoint)."""
        db, self._db = self._db, None
        if self._rewriting is not None and not self._rewriting.done():
            self._rewriting.cancel()
            await asyncio.gather(self._rewriting, return_exceptions=True)
        with contextlib.suppress(GazetteError):  # (a frame being encoded: its end)
            self.folder.recorder.settle()
        if db is not None:
            self.folder.recorder.detach()
            db.set_wal_hook(None)
            db.close(True)
        for mapped in (self._db_map, self._wal_map):
            if mapped is not None:
                mapped.close()
                if mapped.fd != self._wal_fd:
                    os.close(mapped.fd)
        self._db_map = self._wal_map = None
        if self._wal_fd >= 0:
            os.close(self._wal_fd)
            self._wal_fd = -1

    # -- recording the WAL --

    @property
    def _wal_path(self) -> str:
        return self._db_path + "-wal"

    def _on_wal(self, _db: apsw.Connection, _name: str, frames: int) -> int:
        self._frames = frames
        return apsw.SQLITE_OK

    def _open_wal(self) -> None:
        if self._wal_fd < 0:
            self._wal_fd = os.open(self._wal_path, os.O_RDONLY | os.O_CREAT, 0o644)

    def _record_wal(self) -> None:
        """Record the WAL bytes SQLite committed since the last time (whole frames,
        through its last commit), in the recorder's thread: read back, their pages
        noted, and told as patches against the versions before them where most have
        one (`sqlite_wal`), else whole. While a rewrite records the database, patches
        read only the new file's pages recorded so far or copied into it by a
        checkpoint (the log's database is not the local one yet). What they read stays
        as it is until the recorder settles them: the WAL through here, and the
        database (checkpoints and rewrites settle first)."""
        wal = self._wal_frames
        end = wal.end_of(self._frames)
        if end < self._wal_end:
            raise StoreChanged(f"{self.path}: SQLite restarted its WAL outside a rewrite "
                               "(was it checkpointed by the application?)")
        if end == self._wal_end:
            return
        recorder, fnode, wal_fd, start = self.folder.recorder, self._wal_fnode, \
            self._wal_fd, self._wal_end
        if end - start < self.patch_min_bytes or not self.patch_pages:
            # Recorded whole, here: cheaper than a hand-off to the recorder's thread.
            # Read straight into their frames, and seen there: noted later, at once
            # (after the frames being encoded: the recorder settles them first).
            for at, size in wal.pieces(start, end, REWRITE_CHUNK):
                recorder.write_from(fnode, at, wal_fd, size, partial(wal.seen, at))
            self._recorded(end - start)
            self._wal_end = end
            return
        db, db_fnode, held = np.zeros((0, wal.page_size), np.uint8), 0, None
        if self.patch_pages:
            db, db_fnode = self._database(), self._db_fnode()
            if self._rewritten is not None:  # its pages recorded, and those copied in
                held = self._image.held(len(db))
            if self._wal_map is None:
                self._wal_map = Mapped(wal_fd)
        wal_map = self._wal_map

        def make() -> list[Later]:
            out: list[Later] = []
            for at, data, pages, before in wal.read(wal_fd, start, end, REWRITE_CHUNK,
                                                    room=wal_map is not None):
                if wal_map is not None and wal.worth_patching(
                        data, pages, before, len(db), self.patch_min_bytes):
                    patch, sources = wal.patch(data, at, pages, before, wal_map, fnode,
                                               db, db_fnode, held)
                    out.append((Kind.PATCH, fnode, at, patch, None, sources))
                else:
                    out.append((Kind.WRITE, fnode, at, data, None, set()))
            return out

        recorder.record_later(make, self._recorded)
        self._wal_end = end

    def _recorded(self, n: int) -> None:
        self._since_rewrite += n
        self.wal_recorded += n

    def _db_fnode(self) -> int:
        """The log's database file: the new one while a rewrite is under way."""
        if self._rewritten is not None:
            return self._image.fnode
        fnode = self.folder.recorder.fnode(self.name)
        assert fnode is not None
        return fnode

    def _database(self) -> np.ndarray:
        """The database file's pages as of its last change (rows)."""
        if self._db_map is None:
            self._db_map = Mapped(os.open(self.path, os.O_RDONLY))
        ps = self._wal_frames.page_size
        return self._db_map.view(self._db_pages * ps).reshape(-1, ps)

    def _database_changed(self) -> None:
        """(After a checkpoint or a rewrite's.)"""
        self._db_stat = self._stat()
        self._db_pages = self._db_stat[0] // self._wal_frames.page_size

    def _checkpoint(self) -> None:
        """Checkpoint the WAL into the database locally, and record that as the copies
        of each page's last frame into the database: a player runs the same checkpoint,
        from the same WAL, to the same bytes. SQLite then writes its WAL from the start
        again, over the frames before (not truncated: cheaper to write over, and the
        player's WAL, written over alike, stays the same bytes)."""
        recorder, wal = self.folder.recorder, self._wal_frames
        recorder.settle()  # (its frames noted)
        # (During a rewrite, into the new database: the copies land in the pages it
        # recorded and past them; pages it records later are read after this.)
        db_fnode = self._db_fnode()
        pairs, size = wal.copies(), wal.npages * wal.page_size
        # (Frames being encoded read the database and the WAL as they are until here.)
        frames, copied = self.db.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_RESTART)
        if copied != frames or frames != self._frames or \
                os.path.getsize(self.path) != size:
            raise StoreChanged(f"{self.path}: its checkpoint copied {copied} of {frames} "
                               f"frames (not all {self._frames}) or left the database "
                               f"not at {size} bytes")
        recorder.copy(self._wal_fnode, db_fnode, wal.page_size, pairs)
        recorder.truncate(db_fnode, size)
        if self._rewritten is not None:  # (patches may read them from the new file)
            self._image.copied(wal.last_pages())
        wal.restart()
        self._frames = self._wal_end = 0
        self._database_changed()
        self.checkpoints += 1

    def _db_bytes(self) -> int:
        wal = self._wal_frames  # (its last commit frame says, if it has one)
        return (wal.npages or _one(self.db, "PRAGMA page_count")) * wal.page_size

    def _stat(self) -> tuple[int, int]:
        st = os.stat(self._db_path)
        return st.st_size, st.st_mtime_ns

    def _check_db(self) -> None:
        if self._stat() != self._db_stat:
            raise StoreChanged(f"{self.path} changed outside a rewrite (a checkpoint the "
                               "store did not run): the recovery log no longer holds it")

    # -- rewriting --

    async def _read_image(self, fd: int, offset: int, size: int) -> tuple[int, bytes]:
        """A piece of the database a rewrite records: its length, and it (compressed:
        `ops.compressed`, pages of rows mostly compress), in a worker thread."""

        def read() -> tuple[int, bytes]:
            data = os.pread(fd, size, offset)
            return len(data), compressed(data) if self.compress_rewrites else data

        return await asyncio.to_thread(read)

    def _begin_rewrite(self) -> int:
        """Checkpoint the WAL into the database locally (SQLite starts its WAL anew),
        and record the database's new file and the new WAL's, under temporary names:
        the WAL's frames go to the new one from here. Returns the new database's fnode
        (`_rewrite` records its content, then renames both into place)."""
        recorder = self.folder.recorder
        recorder.settle()  # (frames being encoded read the database and the WAL)
        self.db.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
        self._open_wal()
        if os.fstat(self._wal_fd).st_size:
            raise StoreChanged(f"{self._wal_path}: the checkpoint left frames behind")
        self._database_changed()
        self._live_at = 0  # (the image as recorded, compressed, as it goes)
        image = recorder.create(self.name + ".rewrite")
        self._image = Image(image, self._db_stat[0])
        self._wal_fnode = recorder.create(self._wal + ".rewrite")
        self._frames = self._wal_end = self._since_rewrite = 0
        self._wal_frames.restart()
        self._rewritten = asyncio.get_running_loop().create_future()
        self._rewritten.add_done_callback(retrieved)
        return image

    async def _rewrite(self, fnode: int) -> None:
        """Record the database into `fnode`, then rename it and the new WAL into
        place, in one append: every older segment of the log is dead from there.
        Commits sealed meanwhile wait for that append. Checkpoints go on meanwhile
        (the WAL stays short, and SQLite fast), recorded as copies into `fnode`: each
        piece is recorded as read after the checkpoints before it (a piece read while
        one ran is read again), so a player's copies and pieces make the same file."""
        folder, recorder = self.folder, self.folder.recorder
        done = self._rewritten
        assert done is not None
        landing: list[asyncio.Future[Any]] = []
        try:
            image = os.open(self.path, os.O_RDONLY)
            try:
                size, offset = self._image.size, 0
                while offset < size:
                    checkpoints = self.checkpoints
                    want = min(REWRITE_CHUNK, size - offset)
                    read, data = await self._read_image(image, offset, want)
                    if self.checkpoints != checkpoints:
                        continue  # (torn by a checkpoint)
                    if read != want:
                        raise StoreChanged(f"{self.path} is shorter than its rewrite "
                                           f"({offset + read} bytes, not {size})")
                    if self.compress_rewrites:
                        recorder.write_compressed(fnode, offset, data)
                    else:
                        recorder.write(fnode, offset, data)
                    self._live_at += len(data)
                    offset += read
                    self._image.pages = offset // self._wal_frames.page_size
                    landing.append(asyncio.ensure_future(folder.land(recorder.seal())))
                    if len(landing) >= REWRITE_IN_FLIGHT:
                        await landing.pop(0)
            finally:
                os.close(image)
            with recorder.lock:  # (nothing else is recorded between these)
                recorder.rename(self.name + ".rewrite", self.name)
                if folder.exists(self._wal):
                    recorder.unlink(self._wal)
                recorder.rename(self._wal + ".rewrite", self._wal)
            landing.append(asyncio.ensure_future(folder.land(recorder.seal(hints=True))))
            for fut in landing:
                await fut
        except BaseException as err:
            for fut in landing:
                fut.cancel()
            if not done.done():
                done.set_exception(err if isinstance(err, Exception) else
                                   GazetteError(f"{self.path}: the rewrite was stopped"))
            raise
        self.rewrites += 1
        self._rewritten = None
        done.set_result(None)


def _one(db: apsw.Connection, query: str) -> int:
    row = db.execute(query).fetchone()
    assert row is not None
    return int(row[0])
