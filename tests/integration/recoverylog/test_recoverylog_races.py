"""Recovery logs where writers race, on a real broker and etcd: hand-offs racing for a
new shard's empty log take it one after the other (what the last one commits is played
back, and the other's hints never replace its), a compaction through a `RecordedFolder`
(new file, then the old one deleted) plays back from its hints, and a hot standby
stopped while its files are being written stops once they are."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from gazette.client import JournalClient
from gazette.consumer.recovery import load_hints, recover, store_hints
from gazette.keyspace import Etcd
from gazette.protocol import ShardSource, ShardSpec
from gazette.recoverylog import Hints, Player, RecordedFolder, RecorderFenced
from gazette_broker import BrokerServer
from tests.fixtures.recoverylog import digest, logs_client

pytestmark = pytest.mark.integration

TRIALS = 4
SPECS = """
name: races/
replication: 1
fragment:
  stores: [file:///]
  compression_codec: NONE
children:
""" + "".join(f"  - name: races/empty-{i}\n  - name: races/shard-{i}\n"
              for i in range(TRIALS)) + """
  - name: races/compaction
  - name: races/standby
  - name: races/keep
"""


@pytest.fixture
async def client(broker_server: BrokerServer) -> AsyncIterator[JournalClient]:
    async with logs_client(broker_server, SPECS) as c:
        yield c


async def commit_file(folder: RecordedFolder, name: str) -> bool:
    """`name` written (holding its name) and committed; False if the recorder was
    fenced out."""
    folder.replace(name, name.encode())
    try:
        await folder.commit()
    except RecorderFenced:
        return False
    return True


async def played(client: JournalClient, log: str, root: Path,
                 hints: Hints | None = None) -> dict[str, bytes]:
    player = Player(client, log, root, hints)
    await player.play()
    await player.finish()
    return files_of(root)


def files_of(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir()}


async def test_two_handoffs_racing_for_an_empty_log_take_it_one_after_the_other(
        client: JournalClient, tmp_path: Path) -> None:
    for trial in range(TRIALS):
        log, root = f"races/empty-{trial}", tmp_path / str(trial)
        # Both play the empty log, then append their no-ops: one lands first.
        recorders = await asyncio.gather(Player(client, log, root / "a").handoff(0xA0),
                                         Player(client, log, root / "b").handoff(0xB0))
        folders = {name: RecordedFolder(root / name, rec)
                   for name, rec in zip("ab", recorders, strict=True)}
        committed = [name for name, folder in folders.items()
                     if await commit_file(folder, name)]
        assert len(committed) == 1, "the later hand-off fenced the earlier one out"
        [survivor] = committed
        want = {survivor: survivor.encode()}
        assert await played(client, log, root / "from-start") == want, \
            "what the log's writer committed is played back"
        assert await played(client, log, root / "from-hints",
                            folders[survivor].hints) == want


async def test_racing_recoveries_of_a_new_shard_keep_what_the_survivor_commits(
        client: JournalClient, etcd: Etcd, etcd_prefix: str, tmp_path: Path) -> None:
    """Two members take a new shard at once: each recovers (plays the empty log, hands
    off, stores its hints), commits, and stores its hints again when it stops. The
    hints of the one fenced out never replace the survivor's, and the next recovery
    has what the survivor committed."""
    for trial in range(TRIALS):
        spec = ShardSpec(f"shard-{trial}", (ShardSource("in"),), recovery_log_prefix="races",
                         hint_prefix=f"{etcd_prefix}/hints")
        root = tmp_path / str(trial)
        folders = dict(zip("ab", await asyncio.gather(
            recover(client, etcd, spec, root / "a"), recover(client, etcd, spec, root / "b")),
            strict=True))
        outcome = {name: await commit_file(folder, name) for name, folder in folders.items()}
        assert sorted(outcome.values()) == [False, True], outcome
        survivor = next(name for name, ok in outcome.items() if ok)
        fenced = next(name for name, ok in outcome.items() if not ok)
        survivor_hints = folders[survivor].hints
        assert survivor_hints is not None
        await store_hints(etcd, spec, survivor_hints)
        fenced_hints = folders[fenced].hints
        assert fenced_hints is not None
        assert not await store_hints(etcd, spec, fenced_hints), \
            "the fenced member's last hints (earlier in the log) are not stored"
        assert (await load_hints(etcd, spec))[0][1] == survivor_hints

        again = await recover(client, etcd, spec, root / "next")
        assert again.read(survivor) == survivor.encode() and again.read(fenced) is None
        again.recorder.detach()


async def test_a_compaction_through_a_recorded_folder_plays_back_from_its_hints(
        client: JournalClient, tmp_path: Path) -> None:
    """An LSM store compacts by writing a new file, then deleting the old ones: its
    hints name only the new file, and the old one's unlink comes after the new one's
    last write (playback from them failed with InconsistentOp)."""
    recorder = await Player(client, "races/compaction", tmp_path / "p").handoff(0xC0)
    folder = RecordedFolder(tmp_path / "p", recorder)
    for generation in range(4):
        table = folder.open(f"table-{generation}")
        table.pwrite(b"%d" % generation * 1000, 0)
        table.close()
        if generation:
            folder.unlink(f"table-{generation - 1}")
        await folder.commit()
    assert folder.hints is not None and len(folder.hints.live_nodes) == 1
    hints = Hints.decode(folder.hints.encode())  # as stored in etcd
    assert await played(client, "races/compaction", tmp_path / "copy", hints) == \
        {"table-3": b"3" * 1000}


def skipped_ops() -> float:
    return REGISTRY.get_sample_value("gazette_recoverylog_out_of_sequence_ops_total") or 0


async def test_a_standby_stopped_while_it_writes_files_stops_once_they_are_written(
        client: JournalClient, tmp_path: Path) -> None:
    """A hot standby is stopped (its shard made primary here) while a worker thread
    writes a chunk's files: `tail` returns only once they are all written, and the
    hand-off from it reads nothing twice."""
    log, files = "races/standby", 10_000
    primary = await Player(client, log, tmp_path / "p").handoff(0xD0)
    folder = RecordedFolder(tmp_path / "p", primary)
    standby = Player(client, log, tmp_path / "s")
    await standby.play()
    stop = asyncio.Event()
    tailing = asyncio.create_task(standby.tail(stop))
    for i in range(files):  # one commit of many new files: long to play
        folder.open(f"f{i:05}").close()
    await folder.commit()

    loop = asyncio.get_running_loop()

    def stop_once_writing() -> None:
        deadline = time.monotonic() + 30
        while not (tmp_path / "s" / "f00000").exists():
            assert time.monotonic() < deadline, "the standby never wrote a file"
            time.sleep(0.0002)  # (a poll's interval, in this thread)
        loop.call_soon_threadsafe(stop.set)

    await asyncio.to_thread(stop_once_writing)
    await tailing
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted(standby.fsm.links), \
        "when tail returns, the files are as the standby's state says"
    skipped = skipped_ops()
    await standby.handoff(0xD1)
    assert skipped_ops() == skipped, "the hand-off read nothing the standby had played"
    assert digest(tmp_path / "s") == digest(tmp_path / "p")


async def test_hints_that_moved_on_replace_the_backups_too(
        client: JournalClient, etcd: Etcd, etcd_prefix: str) -> None:
    """A store that rewrote its files (`SQLiteStore`) leaves older hints naming a
    stretch of the log prune could free: `everywhere` writes the new ones to every key,
    and a later write leaves the backups as they are."""
    spec = ShardSpec("moved", (ShardSource("in"),), recovery_log_prefix="races",
                     hint_prefix=f"{etcd_prefix}/hints", hint_backups=2)
    older, newer, newest = (Hints("races/moved", {}, through) for through in (5, 9, 12))
    await store_hints(etcd, spec, older, rotate=True)
    await store_hints(etcd, spec, older, rotate=True)
    await store_hints(etcd, spec, older, rotate=True)
    assert [h for _, h in await load_hints(etcd, spec)] == [older] * 3
    assert await store_hints(etcd, spec, newer, everywhere=True)
    assert [h for _, h in await load_hints(etcd, spec)] == [newer] * 3
    assert await store_hints(etcd, spec, newest)
    assert [h for _, h in await load_hints(etcd, spec)] == [newest, newer, newer]


async def test_hints_that_moved_on_are_written_at_once(
        client: JournalClient, etcd: Etcd, etcd_prefix: str, tmp_path: Path) -> None:
    from gazette.consumer.recovery import HINTS_INTERVAL, keep_hints
    from gazette.recoverylog import Segment

    spec = ShardSpec("keep", (ShardSource("in"),), recovery_log_prefix="races",
                     hint_prefix=f"{etcd_prefix}/hints", hint_backups=2)
    root = tmp_path / "store"
    folder = RecordedFolder(root, await Player(client, "races/keep", root).handoff(0x11))

    def at(offset: int, through: int) -> Hints:
        return Hints("races/keep", {1: [Segment(0x11, through, offset, 0, through,
                                                offset + 10)]}, through)

    folder.hints = at(0, 1)
    keeping = asyncio.create_task(keep_hints(etcd, spec, folder))
    await asyncio.sleep(0)  # (it starts from the hints written last)
    try:
        folder.hints = at(500, 2)  # a rewrite landed: the log's start moved on
        folder.moved.set()
        deadline = time.monotonic() + HINTS_INTERVAL / 3
        while [h for _, h in await load_hints(etcd, spec)] != [at(500, 2)] * 3:
            assert time.monotonic() < deadline, "the moved hints were not written at once"
            await asyncio.sleep(0.05)
    finally:
        keeping.cancel()
        await asyncio.gather(keeping, return_exceptions=True)
        folder.recorder.detach()
