"""Recovery logs on a real broker: files recorded by one process are rebuilt
byte-identical by a player (from hints that skip deleted files, and from the log's
start); a successor's handoff fences the old recorder out; a standby's tail keeps up;
a corrupt or cut log and hints past the log's end fail naming the shard and offset."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gazette.client import JournalClient
from gazette.recoverylog import (
    Hints,
    Kind,
    PlaybackError,
    Player,
    RecordedFolder,
    Recorder,
    RecorderFenced,
)
from gazette.recoverylog.ops import encode
from gazette_broker import BrokerServer
from tests.fixtures.polling import eventually
from tests.fixtures.recoverylog import digest, logs_client

pytestmark = pytest.mark.integration

SPECS = """
name: logs/
replication: 1
fragment:
  stores: [file:///]
  length: 65536
  compression_codec: NONE
children:
  - name: logs/one
  - name: logs/two
  - name: logs/three
  - name: logs/four
  - name: logs/five
  - name: logs/six
  - name: logs/seven
  - name: logs/eight
  - name: logs/nine
"""


@pytest.fixture
async def client(broker_server: BrokerServer) -> AsyncIterator[JournalClient]:
    async with logs_client(broker_server, SPECS) as c:
        yield c


class Files(RecordedFolder):
    """A store's folder whose every change is made on disk and recorded."""

    def __init__(self, root: Path, recorder: Recorder) -> None:
        super().__init__(root, recorder)
        self.rec = recorder
        root.mkdir(parents=True, exist_ok=True)

    def write(self, path: str, offset: int, data: bytes) -> None:
        file = self.open(path)
        try:
            file.pwrite(data, offset)
        finally:
            file.close()

    def truncate(self, path: str, size: int) -> None:
        file = self.open(path)
        try:
            file.truncate(size)
        finally:
            file.close()

    def remove(self, path: str) -> None:
        self.unlink(path)


async def replay(client: JournalClient, log: str, root: Path,
                 hints: Hints | None = None) -> Player:
    """A folder rebuilt from `log` (to its write head)."""
    player = Player(client, log, root, hints, name="shard-1")
    await player.play()
    await player.finish()
    return player


async def record_history(files: Files, rng: random.Random, rounds: int) -> None:
    """A store's life: a database written in place and truncated, a journal file
    made and deleted per commit, a state file replaced by rename."""
    for i in range(rounds):
        files.write("db", rng.randrange(0, 1 << 16) & ~4095, rng.randbytes(4096))
        files.write("db-journal", 0, rng.randbytes(rng.randrange(100, 3000)))
        files.remove("db-journal")
        files.write("state.json.tmp", 0, b'{"round": %d}' % i)
        files.rename("state.json.tmp", "state.json")
        if i % 7 == 6:
            files.truncate("db", 8192)
        await files.rec.commit()


async def test_a_played_folder_is_byte_identical_from_hints_or_from_the_start(
        client: JournalClient, tmp_path: Path) -> None:
    player = Player(client, "logs/one", tmp_path / "first", name="shard-1")
    recorder = await player.handoff(author=0x11)
    files = Files(tmp_path / "first", recorder)
    await record_history(files, random.Random(1), 40)
    hints = recorder.hints()
    assert set(hints.live_nodes) == {recorder.fnode("db"), recorder.fnode("state.json")}
    want = digest(files.root)

    from_hints = await replay(client, "logs/one", tmp_path / "second",
                              Hints.decode(hints.encode()))
    assert digest(tmp_path / "second") == want
    from_start = await replay(client, "logs/one", tmp_path / "third")
    assert digest(tmp_path / "third") == want
    # The hints let the player skip what only deleted files wrote.
    assert from_hints.progress.played < from_start.progress.played


async def test_a_successor_fences_the_old_recorder_out(
        client: JournalClient, tmp_path: Path) -> None:
    old = await Player(client, "logs/two", tmp_path / "old").handoff(author=0x21)
    old_files = Files(tmp_path / "old", old)
    old_files.write("db", 0, b"one")
    await old.commit()

    successor = Player(client, "logs/two", tmp_path / "new", old.hints())
    new = await successor.handoff(author=0x22)
    old_files.write("db", 0, b"zombie")  # a zombie's commit is refused
    with pytest.raises(RecorderFenced, match="taken over"):
        await old.commit()
    with pytest.raises(RecorderFenced, match=r"taken over.*fenced out"):
        old_files.write("db", 0, b"again")

    new_files = Files(tmp_path / "new", new)
    new_files.write("db", 3, b"two")
    await new.commit()
    await replay(client, "logs/two", tmp_path / "check", new.hints())
    assert (tmp_path / "check" / "db").read_bytes() == b"onetwo"


async def test_every_error_after_a_fenced_append_says_it_was_fenced(
        client: JournalClient, tmp_path: Path) -> None:
    """A store with commits under way that learns of its fencing from the next seal
    (before the failed commit's land raised) is told the same: another writer took the
    log over (a shard's status shows that error, found by the racing fault test)."""
    old = await Player(client, "logs/three", tmp_path / "old").handoff(author=0x31)
    old_files = Files(tmp_path / "old", old)
    old_files.write("db", 0, b"one")
    await old.commit()
    await Player(client, "logs/three", tmp_path / "new", old.hints()).handoff(author=0x32)
    old_files.write("db", 0, b"zombie")
    first = asyncio.ensure_future(old.land(old.seal()))
    await asyncio.wait({first})  # (its append refused; nobody awaited its error yet)
    with pytest.raises(RecorderFenced, match=r"taken over by another writer .*fenced out"):
        old_files.write("db", 0, b"more")
    with pytest.raises(RecorderFenced, match=r"taken over by another writer .*fenced out"):
        old.seal()
    with pytest.raises(RecorderFenced, match=r"taken over by another writer .*fenced out"):
        await first


async def test_what_is_recorded_while_a_commit_is_under_way_commits_next(
        client: JournalClient, tmp_path: Path) -> None:
    """A shard's next transaction runs while the previous one commits: its operations
    go after the commit under way, not into it (nor lost when it ends)."""
    rec = await Player(client, "logs/six", tmp_path / "p").handoff(author=0x61)
    files = Files(tmp_path / "p", rec)
    files.write("db", 0, b"first")
    under_way = asyncio.create_task(rec.commit())
    await asyncio.sleep(0)  # one step of the loop: the commit takes its operations and
    assert rec.pending_bytes == 0 and not under_way.done()  # waits on its append
    files.write("db", 5, b"+second")
    await under_way
    await rec.commit()
    await replay(client, "logs/six", tmp_path / "copy", rec.hints())
    assert (tmp_path / "copy" / "db").read_bytes() == b"first+second"


async def test_a_standby_tails_the_log_and_takes_over_where_it_is(
        client: JournalClient, tmp_path: Path) -> None:
    primary = await Player(client, "logs/three", tmp_path / "p").handoff(author=0x31)
    files = Files(tmp_path / "p", primary)
    files.write("db", 0, b"before")
    await primary.commit()
    standby = Player(client, "logs/three", tmp_path / "s", primary.hints())
    stop = asyncio.Event()
    tailing = asyncio.create_task(standby.tail(stop))
    for i in range(20):
        files.write("db", 6 + i, b"%d" % (i % 10))
        await primary.commit()
    want = digest(tmp_path / "p")
    await eventually(lambda: standby.offset >= primary.head, "the standby caught up")
    stop.set()
    await tailing
    taken = await standby.handoff(author=0x32)
    assert digest(tmp_path / "s") == want and taken.head > primary.head


async def test_bad_logs_and_hints_fail_naming_the_shard_and_offset(
        client: JournalClient, tmp_path: Path) -> None:
    rec = await Player(client, "logs/four", tmp_path / "a").handoff(author=0x41)
    files = Files(tmp_path / "a", rec)
    files.write("db", 0, b"x" * 100)
    await rec.commit()
    good_end = rec.head
    hints = rec.hints()

    past = Hints.decode(hints.encode())
    for segs in past.live_nodes.values():
        segs[-1].last_offset = good_end + 1000
    with pytest.raises(PlaybackError, match=r"shard-4: .* at offset \d+: the hints point "
                                            "past the log's end"):
        await Player(client, "logs/four", tmp_path / "b", past, name="shard-4").play()

    frame, _ = encode(Kind.WRITE, rec.fsm.next_seq_no, rec.fsm.next_checksum, 0x41,
                      fnode=1, length=100, data=b"y" * 100)
    await client.append("logs/four", frame[:60])  # a torn frame at the log's end
    with pytest.raises(PlaybackError, match=f"shard-4: playing recovery log logs/four at "
                                            f"offset {good_end}: a frame is cut off"):
        await Player(client, "logs/four", tmp_path / "c", hints, name="shard-4").play()

    await client.append("logs/five", b"garbage that is not a frame at all\n" * 3)
    with pytest.raises(PlaybackError, match="shard-5: playing recovery log logs/five at "
                                            "offset 0: no frame starts here"):
        await Player(client, "logs/five", tmp_path / "d", name="shard-5").play()


async def test_a_copy_or_patch_that_cannot_be_played_fails_naming_where(
        client: JournalClient, tmp_path: Path) -> None:
    # A writer's bug, not a torn frame (its CRC is good): the data does not decode, or
    # a block it reads is past its source's end.
    rec = await Player(client, "logs/seven", tmp_path / "a").handoff(author=0x71)
    files = Files(tmp_path / "a", rec)
    files.write("db", 0, b"x" * 100)
    wal = rec.create("wal")
    await rec.commit()
    at = rec.head
    db = rec.fnode("db")
    assert db is not None
    rec.patch(db, 0, [(wal, 0, 4)], b"abcd")  # the WAL is empty: nothing at 0..4
    await rec.commit()
    with pytest.raises(PlaybackError, match=f"shard-7: playing recovery log logs/seven at "
                                            f"offset {at}: writing the files: patch at 0 "
                                            f"of fnode {db}: a block it reads is past"):
        await Player(client, "logs/seven", tmp_path / "b", name="shard-7").play()
    rec = await Player(client, "logs/eight", tmp_path / "c").handoff(author=0x81)
    Files(tmp_path / "c", rec).write("db", 0, b"x" * 100)
    await rec.commit()
    at = rec.head
    frame, _ = encode(Kind.PATCH, rec.fsm.next_seq_no, rec.fsm.next_checksum, 0x81,
                      fnode=rec.fnode("db") or 0, length=9, data=b"not zstd!")
    await client.append("logs/eight", frame)
    with pytest.raises(PlaybackError, match=f"shard-8: playing recovery log logs/eight at "
                                            f"offset {at}: writing the files: patch data "
                                            "does not decompress"):
        await Player(client, "logs/eight", tmp_path / "d", name="shard-8").play()


async def test_bytes_recorded_from_a_file_play_back_and_commits_land_without_a_task(
        client: JournalClient, tmp_path: Path) -> None:
    """`write_from` reads a file's bytes straight into their frame (what a SQLite store
    does with its WAL): they play back as written. A commit released by
    `RecordedFolder.landing` lands in order and leaves its hints as `land` does; once
    the log is taken over, its future fails saying so."""
    rec = await Player(client, "logs/nine", tmp_path / "p").handoff(author=0x91)
    files = Files(tmp_path / "p", rec)
    rng = random.Random(7)
    data = rng.randbytes(70_000)
    (tmp_path / "p" / "wal").write_bytes(data)
    fnode = rec.create("wal")
    fd = os.open(tmp_path / "p" / "wal", os.O_RDONLY)
    seen: list[bytes] = []
    try:
        rec.write_from(fnode, 0, fd, 50_000, lambda view: seen.append(bytes(view[:4])))
        first = files.landing(rec.seal(hints=True))
        rec.write_from(fnode, 50_000, fd, 20_000)
        second = files.landing(rec.seal(hints=True))
        with pytest.raises(OSError, match="holds 0 bytes at 70000, not 10"):
            rec.write_from(fnode, 70_000, fd, 10)
    finally:
        os.close(fd)
    assert seen == [data[:4]]
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert files.hints is not None and files.hints == rec.hints()
    played = await replay(client, "logs/nine", tmp_path / "copy", rec.hints())
    assert (tmp_path / "copy" / "wal").read_bytes() == data
    assert played.offset == rec.head

    await Player(client, "logs/nine", tmp_path / "new", rec.hints()).handoff(author=0x92)
    files.write("wal", 0, b"zombie")
    with pytest.raises(RecorderFenced, match="taken over"):
        await asyncio.wait_for(files.landing(rec.seal()), 10)
