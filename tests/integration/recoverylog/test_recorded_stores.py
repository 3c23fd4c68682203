"""Stores on a recovery log, against a real broker: a SQLite database and a JSON file
written through their recorded folders are rebuilt from the log by a player, byte for
byte, with their checkpoints; a crash between a local commit and its log append loses
only that transaction; a successor fences the old store's commits out. SQLite: a rewrite
leaves every older segment of the log dead; commits under way at once land in order;
commits recorded whole and as patches, interleaved, play the same; a
checkpoint the store did not run fails it; a WAL restarted over older frames is read to
its end; a log over its bound when opened is rewritten."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from gazette.client import JournalClient
from gazette.consumer import Checkpoint, JSONFileStore
from gazette.consumer.sqlite import SQLiteStore
from gazette.recoverylog import Hints, Player, RecordedFolder, RecorderFenced
from gazette.recoverylog.ops import Decoder
from gazette_broker import BrokerServer
from tests.fixtures.recoverylog import digest, logs_client

pytestmark = pytest.mark.integration

SPECS = """
name: stores/
replication: 1
fragment:
  stores: [file:///]
  length: 1048576
  compression_codec: NONE
children:
  - name: stores/sqlite-10000
  - name: stores/sqlite-40
  - name: stores/json
  - name: stores/crash
  - name: stores/fence
  - name: stores/rewrite-True
  - name: stores/rewrite-False
  - name: stores/pipelined-1
  - name: stores/pipelined-2
  - name: stores/foreign
  - name: stores/legacy
  - name: stores/reopened
  - name: stores/midrewrite
  - name: stores/ckpt-rewrite
  - name: stores/ckpt-encoding-True
  - name: stores/ckpt-encoding-False
  - name: stores/whole-and-patched
"""


@pytest.fixture
async def client(broker_server: BrokerServer) -> AsyncIterator[JournalClient]:
    async with logs_client(broker_server, SPECS) as c:
        yield c


async def take(client: JournalClient, log: str, root: Path, author: int,
               hints: Hints | None = None) -> RecordedFolder:
    """Play `log` into `root` and become its writer: the folder a primary's store gets."""
    recorder = await Player(client, log, root, hints).handoff(author)
    return RecordedFolder(root, recorder)


async def sqlite_on(client: JournalClient, log: str, root: Path, author: int,
                    hints: Hints | None = None) -> SQLiteStore:
    """A SQLiteStore on `log`, played into `root`, restored."""
    store = SQLiteStore(await take(client, log, root, author, hints))
    await store.restore_checkpoint()
    return store


async def plays_to(client: JournalClient, log: str, root: Path, hints: Hints | None,
                   want: dict[str, str]) -> None:
    """A player makes the folder whose digest is `want`, from `hints` and from the
    log's start (each into a folder of `root`)."""
    for name, given in (("from-hints", hints), ("from-start", None)):
        player = Player(client, log, root / name, given)
        await player.play()
        await player.finish()
        assert digest(root / name) == want, name


def rows(db: apsw.Connection) -> list[tuple[int, str]]:
    return [(int(k), str(v)) for k, v in db.execute("SELECT k, v FROM kv ORDER BY k")]


def checkpoint(n: int) -> Checkpoint:
    return Checkpoint.of({"input/a": n * 100}, {}, [])


async def sqlite_history(store: SQLiteStore, rng: random.Random, txns: int,
                         first: int = 0) -> None:
    """Inserts, updates and deletes, enough to roll the WAL through checkpoints."""
    for t in range(first, first + txns):
        db = store.db
        db.execute("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v TEXT)")
        db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)",
                       [(rng.randrange(5000), rng.randbytes(rng.randrange(10, 300)).hex())
                        for _ in range(200)])
        db.execute("DELETE FROM kv WHERE k % 97 = ?", (t % 97,))
        await store.start_commit(checkpoint(t + 1), [])


@pytest.mark.parametrize("checkpoint_pages", [10_000, 40])
async def test_a_sqlite_store_is_rebuilt_byte_identical_with_its_checkpoint(
        client: JournalClient, tmp_path: Path, checkpoint_pages: int) -> None:
    # With checkpoints, the player runs them from the recorded copies: the same bytes.
    log = f"stores/sqlite-{checkpoint_pages}"
    folder = await take(client, log, tmp_path / "primary", 0x51)
    store = SQLiteStore(folder, checkpoint_pages=checkpoint_pages)
    assert await store.restore_checkpoint() == Checkpoint()
    await sqlite_history(store, random.Random(5), 60)
    assert (store.checkpoints > 5) == (checkpoint_pages < 1000), store.checkpoints
    want_rows = rows(store.db)
    want_files = digest(tmp_path / "primary")
    assert "store.db" in want_files and "store.db-wal" in want_files
    hints = await folder.recorder.commit(hints=True)
    assert hints is not None

    # From the hints, and from the log's start: the same bytes, a sound database.
    await plays_to(client, log, tmp_path, hints, want_files)
    await store.close()

    successor = SQLiteStore(await take(client, log, tmp_path / "next", 0x52, hints),
                            checkpoint_pages=checkpoint_pages)
    assert await successor.restore_checkpoint() == checkpoint(60)
    assert successor.db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert rows(successor.db) == want_rows
    wal = tmp_path / "next" / "store.db-wal"
    stale = successor._wal_frames.valid_end(str(wal)) != wal.stat().st_size
    assert stale == (checkpoint_pages < 1000)  # (frames of a generation before)
    await sqlite_history(successor, random.Random(6), 5, first=60)  # and it goes on
    more = await successor.folder.recorder.commit(hints=True)
    want_files = digest(tmp_path / "next")
    await successor.close()
    player = Player(client, log, tmp_path / "third", more)
    await player.play()
    await player.finish()
    assert digest(tmp_path / "third") == want_files


async def test_a_sqlite_commit_not_appended_is_not_played(
        client: JournalClient, tmp_path: Path) -> None:
    """The local commit happens at once; the log append after the transaction's
    publishes. A primary that dies between the two loses that transaction only."""
    folder = await take(client, "stores/crash", tmp_path / "primary", 0x61)
    store = SQLiteStore(folder)
    await store.restore_checkpoint()
    await sqlite_history(store, random.Random(7), 3)
    kept = rows(store.db)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    store.db.execute("INSERT OR REPLACE INTO kv VALUES (-1, 'lost')")
    commit = store.start_commit(checkpoint(99), [never])  # its publishes never land
    store.db.execute("INSERT OR REPLACE INTO kv VALUES (-2, 'next txn')")
    assert not commit.done()
    commit.cancel()
    await asyncio.gather(commit, return_exceptions=True)
    folder.recorder.detach()  # the process is gone

    successor = SQLiteStore(await take(client, "stores/crash", tmp_path / "next", 0x62))
    assert await successor.restore_checkpoint() == checkpoint(3)
    assert rows(successor.db) == kept
    await successor.close()


async def test_a_json_file_store_on_the_log(client: JournalClient, tmp_path: Path) -> None:
    folder = await take(client, "stores/json", tmp_path / "primary", 0x71)
    store = JSONFileStore(folder)
    assert await store.restore_checkpoint() == Checkpoint()
    for n in range(1, 6):
        store.state["n"] = n
        await store.start_commit(checkpoint(n), [])
    want = digest(tmp_path / "primary")
    assert set(want) == {"state.json"}

    successor = JSONFileStore(await take(client, "stores/json", tmp_path / "next", 0x72))
    assert await successor.restore_checkpoint() == checkpoint(5)
    assert successor.state == {"n": 5} and digest(tmp_path / "next") == want


async def test_a_successor_fences_the_old_store_out(
        client: JournalClient, tmp_path: Path) -> None:
    old = SQLiteStore(await take(client, "stores/fence", tmp_path / "old", 0x81))
    await old.restore_checkpoint()
    await sqlite_history(old, random.Random(8), 2)

    new = SQLiteStore(await take(client, "stores/fence", tmp_path / "new", 0x82))
    assert await new.restore_checkpoint() == checkpoint(2)
    old.db.execute("INSERT INTO kv VALUES (-1, 'zombie')")
    with pytest.raises(RecorderFenced):
        await old.start_commit(checkpoint(50), [])
    await old.close()
    await sqlite_history(new, random.Random(9), 1, first=2)
    await new.close()

    check = SQLiteStore(await take(client, "stores/fence", tmp_path / "check", 0x83))
    assert await check.restore_checkpoint() == checkpoint(3)
    assert check.db.execute("SELECT count(*) FROM kv WHERE v = 'zombie'").fetchone() == (0,)
    await check.close()


@pytest.mark.parametrize("compress", [True, False])
async def test_a_rewrite_leaves_the_older_log_dead_and_plays_the_same(
        client: JournalClient, tmp_path: Path, compress: bool) -> None:
    log = f"stores/rewrite-{compress}"
    folder = await take(client, log, tmp_path / "primary", 0x91)
    store = SQLiteStore(folder, page_size=1024, rewrite_factor=0.5,
                        rewrite_min_bytes=64 << 10, checkpoint_pages=30,
                        compress_rewrites=compress)
    await store.restore_checkpoint()
    first_hints = folder.hints
    assert first_hints is not None and store.rewrites == 1  # the creation's
    await sqlite_history(store, random.Random(10), 40)
    assert store.rewrites > 2 and store.checkpoints > 2
    await folder.recorder.commit()
    hints = folder.hints
    assert hints is not None
    want_rows = rows(store.db)
    # Hints now start after the log's first half: a player skips all of it.
    start = min(seg.first_offset for segs in hints.live_nodes.values() for seg in segs)
    head = await client.write_head(log)
    assert start > head // 4, (start, head)
    # What a player makes from the hints and from the log's start is the primary's
    # folder (the database as rewritten, the WAL since), and a sound database.
    want = digest(tmp_path / "primary")
    await plays_to(client, log, tmp_path, hints, want)
    await store.close()
    successor = SQLiteStore(await take(client, log, tmp_path / "next", 0x92,
                                       hints))
    assert await successor.restore_checkpoint() == checkpoint(40)
    assert successor.db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert rows(successor.db) == want_rows
    assert successor.rewrites == 0  # its WAL played whole: it goes on appending to it
    await successor.close()


@pytest.mark.parametrize("patched", [True, False])
async def test_a_checkpoint_waits_until_what_is_being_encoded_is_worth_it(
        client: JournalClient, tmp_path: Path, patched: bool) -> None:
    # A checkpoint waits for the frames being encoded: while some are (patches, in the
    # recorder's thread), it comes at 3 x checkpoint_pages; else at checkpoint_pages.
    at: list[int] = []

    class Watched(SQLiteStore):
        def _checkpoint(self) -> None:
            at.append(self._frames)
            super()._checkpoint()

    log = f"stores/ckpt-encoding-{patched}"
    folder = await take(client, log, tmp_path / "primary", 0xE5)
    store = Watched(folder, checkpoint_pages=40, patch_pages=patched, patch_min_bytes=0)
    await store.restore_checkpoint()
    recorder = folder.recorder
    record_later = recorder.record_later

    def slowly(make: Any, recorded: Any = None) -> None:
        def slow() -> Any:
            time.sleep(0.02)  # (a big commit's patches: still encoding at the check)
            return make()
        record_later(slow, recorded)

    recorder.record_later = slowly  # type: ignore[method-assign]
    rng, most = random.Random(8), 0  # (small commits: a few frames each)
    store.db.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)")
    for t in range(100):
        before = store._frames
        store.db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)",
                             [(rng.randrange(5000), rng.randbytes(100).hex())
                              for _ in range(4)])
        await store.start_commit(checkpoint(t + 1), [])
        most = max(most, store._frames - before)
    least = 3 * 40 if patched else 40
    assert len(at) >= 2 and all(least <= frames < least + most for frames in at), at
    want_files = digest(tmp_path / "primary")
    hints = await recorder.commit(hints=True)
    await store.close()
    player = Player(client, log, tmp_path / "played", hints)
    await player.play()
    await player.finish()
    assert digest(tmp_path / "played") == want_files


async def test_checkpoints_during_a_rewrite_play_the_same(
        client: JournalClient, tmp_path: Path) -> None:
    # The WAL is checkpointed while a rewrite records the database (as copies into the
    # new file); a piece of it read while a checkpoint ran is read again.
    gate, reads = asyncio.Event(), []

    class Slow(SQLiteStore):
        async def _read_image(self, fd: int, offset: int, size: int) -> tuple[int, bytes]:
            data = await super()._read_image(fd, offset, size)
            if self.rewrites:  # (not the creation's)
                reads.append(offset)
                await gate.wait()  # commits, and their checkpoints, go on meanwhile
            return data

    log = "stores/ckpt-rewrite"
    folder = await take(client, log, tmp_path / "primary", 0xE1)
    store = Slow(folder, checkpoint_pages=40, rewrite_factor=0.5, rewrite_min_bytes=0,
                 patch_min_bytes=0)  # (every commit as patches: of copied pages too)
    await store.restore_checkpoint()
    rng, commits, t = random.Random(13), [], 0
    store.db.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)")
    began = None  # the checkpoints run when the rewrite began
    while began is None or store.checkpoints < began + 3:
        store.db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)",
                             [(rng.randrange(3000), rng.randbytes(200).hex())
                              for _ in range(50)])
        t += 1
        commits.append(store.start_commit(checkpoint(t), []))
        if began is None and store.rewriting:
            began = store.checkpoints
        await asyncio.sleep(0)
        assert t < 500, "no rewrite, or no checkpoints during it"
    gate.set()
    await asyncio.gather(*commits)
    assert store.rewrites == 2 and len(reads) >= 2  # (read again once torn)
    want_rows, want_files = rows(store.db), digest(tmp_path / "primary")
    hints = await folder.recorder.commit(hints=True)
    await store.close()
    await plays_to(client, log, tmp_path, hints, want_files)
    successor = await sqlite_on(client, log, tmp_path / "next", 0xE2, hints)
    assert rows(successor.db) == want_rows
    assert successor.db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    await successor.close()


@pytest.mark.parametrize("appends", [1, 2])
async def test_commits_under_way_at_once_land_in_order(
        client: JournalClient, tmp_path: Path, appends: int) -> None:
    # One append at a time (what is sealed meanwhile goes merged), or two under way
    # (the second at the offset the first ends at).
    log = f"stores/pipelined-{appends}"
    store = await sqlite_on(client, log, tmp_path / "primary", 0xA1)
    folder = store.folder
    folder.recorder.appends_in_flight = appends
    store.db.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)")
    gates = [asyncio.get_running_loop().create_future() for _ in range(6)]
    commits = []
    for t in range(6):  # each waits for its "publishes": released last first
        store.db.execute("INSERT INTO kv VALUES (?, ?)", (t, f"txn {t}"))
        commits.append(store.start_commit(checkpoint(t + 1), [gates[t]]))
    for gate in reversed(gates):
        gate.set_result(None)
        await asyncio.sleep(0.01)
    await asyncio.gather(*commits)
    hints = folder.hints
    await store.close()
    successor = await sqlite_on(client, log, tmp_path / "next", 0xA2, hints)
    assert Checkpoint.decode(bytes(successor.db.execute(
        "SELECT checkpoint FROM gazette_checkpoint").fetchone()[0])) == checkpoint(6)
    assert rows(successor.db) == [(t, f"txn {t}") for t in range(6)]
    await successor.close()


async def test_a_checkpoint_the_store_did_not_run_fails_it(
        client: JournalClient, tmp_path: Path) -> None:
    from gazette.consumer.sqlite import StoreChanged

    store = await sqlite_on(client, "stores/foreign", tmp_path / "primary", 0xB1)
    await sqlite_history(store, random.Random(11), 2)
    store.db.execute("COMMIT")
    store.db.execute("PRAGMA wal_checkpoint(FULL)")  # the application's own
    store.db.execute("BEGIN")
    store.db.execute("INSERT OR REPLACE INTO kv VALUES (-1, 'after')")
    with pytest.raises(StoreChanged, match="outside a rewrite"):
        store.start_commit(checkpoint(3), [])
    await store.close()


async def test_a_wal_with_older_frames_after_the_newest_is_read_to_its_end(
        client: JournalClient, tmp_path: Path) -> None:
    # A checkpoint restarts the WAL over its older frames (logs recorded page by page
    # hold such WALs too): SQLite reads it through the last commit of its header's
    # generation (the salts tell), and so does the store, which goes on from there.
    folder = await take(client, "stores/legacy", tmp_path / "primary", 0xC1)
    local = apsw.Connection(str(tmp_path / "plain.db"))
    local.execute("PRAGMA journal_mode=WAL")
    local.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)")
    local.execute("INSERT INTO kv VALUES (1, 'one')")
    local.execute("PRAGMA wal_checkpoint(PASSIVE)")
    for k in range(2, 40):  # a generation of frames, checkpointed
        local.execute("INSERT INTO kv VALUES (?, ?)", (k, "x" * 500))
    local.execute("PRAGMA wal_checkpoint(PASSIVE)")
    local.execute("INSERT INTO kv VALUES (100, 'newest')")  # restarts the WAL at 0
    wal = (tmp_path / "plain.db-wal").read_bytes()
    image = (tmp_path / "plain.db").read_bytes()
    local.close(True)
    for name, data in (("store.db", image), ("store.db-wal", wal)):
        file = folder.open(name)
        file.pwrite(data, 0)
        file.close()
    await folder.commit()
    folder.recorder.detach()

    successor = SQLiteStore(await take(client, "stores/legacy", tmp_path / "next", 0xC2))
    assert successor._wal_frames.valid_end(str(tmp_path / "next" / "store.db-wal")) \
        < len(wal)
    await successor.restore_checkpoint()
    assert successor.rewrites == 0
    assert successor.db.execute("SELECT v FROM kv WHERE k = 100").fetchone() == ("newest",)
    assert successor.db.execute("SELECT count(*) FROM kv").fetchone() == (40,)
    successor.db.execute("INSERT INTO kv VALUES (101, 'after')")
    await successor.start_commit(checkpoint(1), [])
    want = digest(tmp_path / "next")
    hints = await successor.folder.recorder.commit(hints=True)
    await successor.close()
    player = Player(client, "stores/legacy", tmp_path / "third", hints)
    await player.play()
    await player.finish()
    assert digest(tmp_path / "third") == want


async def test_a_log_over_its_bound_when_opened_is_rewritten_at_a_commit(
        client: JournalClient, tmp_path: Path) -> None:
    # The log a player needs is counted from the open (not from zero): a store that
    # restarts often still rewrites.
    store = SQLiteStore(await take(client, "stores/reopened", tmp_path / "a", 0xC5),
                        rewrite_factor=100.0)
    await store.restore_checkpoint()
    await sqlite_history(store, random.Random(12), 20)
    hints = await store.folder.recorder.commit(hints=True)
    await store.close()
    assert store.rewrites == 1  # (its creation's)

    again = SQLiteStore(await take(client, "stores/reopened", tmp_path / "b", 0xC6, hints),
                        rewrite_factor=0.5, rewrite_min_bytes=0)
    await again.restore_checkpoint()
    assert again.rewrites == 0 and not again.rewriting
    again.db.execute("INSERT OR REPLACE INTO kv VALUES (1, 'x')")
    await again.start_commit(checkpoint(21), [])
    assert again.rewriting
    again.db.execute("INSERT OR REPLACE INTO kv VALUES (2, 'x')")
    await again.start_commit(checkpoint(22), [])  # (sealed during it: lands after it)
    assert again.rewrites == 1
    await again.close()


async def test_a_commit_during_a_rewrite_is_durable_only_once_the_rewrite_landed(
        client: JournalClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gazette.consumer import sqlite

    monkeypatch.setattr(sqlite, "REWRITE_CHUNK", 1024)  # a rewrite of many appends
    held = asyncio.Event()

    class Held(SQLiteStore):
        async def _read_image(self, fd: int, offset: int, size: int) -> tuple[int, bytes]:
            if offset >= 4096 and self.rewrites:  # (not the creation's)
                await held.wait()  # the process dies before the rewrite ends
            return await super()._read_image(fd, offset, size)

    folder = await take(client, "stores/midrewrite", tmp_path / "primary", 0xD1)
    store = Held(folder, rewrite_factor=0.01, rewrite_min_bytes=0)
    await store.restore_checkpoint()
    store.db.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)")
    store.db.executemany("INSERT INTO kv VALUES (?, ?)",
                         [(k, "x" * 200) for k in range(500)])
    # Commits until one begins a rewrite (what a commit recorded may count only once
    # it is encoded): that one is sealed before it, and durable.
    n = 1
    while True:
        commit = store.start_commit(checkpoint(n), [])
        if store.rewriting:
            await commit
            break
        await commit
        n += 1
        store.db.execute("INSERT INTO kv VALUES (?, 'before the rewrite')", (-1 - n,))
    store.db.execute("INSERT INTO kv VALUES (-1, 'during the rewrite')")
    during = store.start_commit(checkpoint(n + 1), [])
    await asyncio.sleep(0.05)
    assert store.rewriting and not during.done()  # its frames landed; it waits
    folder.recorder.detach()  # the process is gone mid-rewrite
    await store.close()
    with pytest.raises(Exception):  # noqa: B017 - whatever stopped the rewrite
        await during

    successor = SQLiteStore(await take(client, "stores/midrewrite", tmp_path / "next",
                                       0xD2))
    assert await successor.restore_checkpoint() == checkpoint(n)
    assert successor.db.execute("SELECT count(*) FROM kv").fetchone() == (500 + n - 1,)
    assert not (tmp_path / "next" / "store.db.rewrite").exists()
    assert not successor.folder.exists("store.db-wal.rewrite")
    await sqlite_history(successor, random.Random(12), 3, first=n)  # and it goes on
    await successor.close()


@pytest.mark.parametrize(("options", "message"), [
    ({"checkpoint_pages": 0}, "checkpoint_pages must be a number, at least 1, not 0"),
    ({"rewrite_factor": -1}, "rewrite_factor must be a number, positive, not -1"),
    ({"page_size": 1000}, "page_size 1000 is not a power of two"),
    ({"patch_min_bytes": "x"}, "patch_min_bytes must be a number, at least 0, not 'x'"),
    ({"compress_rewrites": "no"}, "compress_rewrites must be true or false, not 'no'"),
])
def test_bad_options_are_refused_naming_them(tmp_path: Path, options: dict[str, object],
                                              message: str) -> None:
    from gazette.errors import GazetteError

    with pytest.raises(GazetteError, match=message):
        SQLiteStore(object(), **options)  # type: ignore[arg-type]


async def test_commits_recorded_whole_and_as_patches_interleaved_play_the_same(
        client: JournalClient, tmp_path: Path) -> None:
    """Small commits are read straight into their frames and their pages noted later
    (`WalFrames.seen`); large ones are patches against the versions before their
    pages, found among those small commits' frames: interleaved, with checkpoints and a
    rewrite between them, the log plays to the same files and rows."""
    log = "stores/whole-and-patched"
    folder = await take(client, log, tmp_path / "primary", 0xE7)
    store = SQLiteStore(folder, page_size=1024, checkpoint_pages=150,
                        patch_min_bytes=8 << 10, rewrite_factor=0.5,
                        rewrite_min_bytes=256 << 10)
    await store.restore_checkpoint()
    rng, commits = random.Random(17), []
    store.db.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)")
    for t in range(120):
        n = 1 if t % 3 else 40  # (a page or two: whole; forty rows here and there: patched)
        store.db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)",
                             [(rng.randrange(2000), rng.randbytes(60).hex())
                              for _ in range(n)])
        commits.append(store.start_commit(checkpoint(t + 1), []))
        await asyncio.sleep(0)
    await asyncio.gather(*commits)
    assert store.checkpoints >= 2 and store.rewrites >= 2, (store.checkpoints,
                                                            store.rewrites)
    want_rows, want_files = rows(store.db), digest(tmp_path / "primary")
    hints = await folder.recorder.commit(hints=True)
    await store.close()
    kinds: set[str] = set()  # (a patch that reads files: of WAL frames, not a rewrite's)
    decoder = Decoder(log, 0)
    async for chunk in client.read(log, 0, end_offset=await client.write_head(log)):
        kinds.update(op.kind.name + ("-reading" if op.path else "")
                     for op, _ in decoder.feed(chunk.content))
    assert {"WRITE", "PATCH-reading", "COPY"} <= kinds, kinds
    await plays_to(client, log, tmp_path, hints, want_files)
    successor = await sqlite_on(client, log, tmp_path / "next", 0xE8, hints)
    assert rows(successor.db) == want_rows
    assert successor.db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    await successor.close()
