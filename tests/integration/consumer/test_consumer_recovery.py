"""Shards whose stores live on recovery logs, against a real etcd and broker: a SQLite
store survives crashes of its primary with every sum exact (played back from the log
each time, from hints in etcd); bad hints fall back to older ones; a log that cannot
be played fails the shard with the shard and offset named; a hot standby tails the log
and takes over when its primary drains."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from gazette.client import AppendQueue, JournalClient, ShardClient
from gazette.consumer import Application, Shard, ShardRunner
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.consumer.recovery import Recovery, load_hints
from gazette.consumer.shard import FAILED, PRIMARY, RECOVERING, STANDBY
from gazette.consumer.sqlite import SQLiteStore
from gazette.keyspace import Etcd, Layout, apply_changes
from gazette.message import Envelope, Publisher
from gazette.protocol import ReplicaStatus, ShardSource, ShardSpec, SpecChange
from gazette.recoverylog import Hints, PlaybackError, Player
from gazette_broker import BrokerServer
from tests.fixtures.consumer import (
    KEYS,
    Stores,
    Sums,
    committed_outputs,
    members_of,
    primaries,
    produce,
    publish,
)
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.polling import eventually
from tests.fixtures.relay import Relay

pytestmark = pytest.mark.integration

LOGS = """
name: logs/
replication: 1
fragment:
  stores: ["file:///"]
  compression_codec: NONE
children:
  - name: logs/sums/shard-0
  - name: logs/shard-0
  - name: logs/shard-1
  - name: logs/shard-2
  - name: logs/shard-3
"""


class SQLiteSums(Sums):
    """`Sums` with its totals in a SQLite table on the shard's recovery log."""

    def __init__(self) -> None:
        super().__init__(None)

    def new_store(self, shard: Shard) -> Any:
        return SQLiteStore(shard.folder)

    def begin_txn(self, shard: Shard, store: Any) -> None:
        store.db.execute("CREATE TABLE IF NOT EXISTS sums (key TEXT PRIMARY KEY, n INT)")

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        key, n = envelope.message["key"], envelope.message["n"]
        store.db.execute("INSERT INTO sums VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                         "SET n = n + excluded.n", (key, n))
        shard.txn[key] = shard.txn.get(key, 0) + n


def log_spec(etcd_prefix: str, **kw: Any) -> ShardSpec:
    return ShardSpec("sums/shard-0", (ShardSource("sums/input"),), recovery_log_prefix="logs",
                     hint_prefix=etcd_prefix.rsplit("/", 1)[0] + "/hints", **kw)


@pytest.fixture
async def logs_client(sums_client: JournalClient, broker_server: BrokerServer
                      ) -> AsyncIterator[JournalClient]:
    await broker_server.apply_yaml(LOGS)
    yield sums_client


@pytest.fixture
async def etcd(etcd_server: EtcdServer, etcd_prefix: str) -> AsyncIterator[Etcd]:
    async with Etcd(etcd_server.endpoint) as client:
        yield client


async def run_to_crash(runner: ShardRunner, transactions: int) -> None:
    """Run until `transactions` commit (0: until the store is restored), then crash
    (cancel)."""
    task = asyncio.create_task(runner.run())
    try:
        await eventually(lambda: (runner.shard.progress.transactions >= transactions if
                                  transactions else runner.store is not None)
                         or task.done(), f"{transactions} transactions commit", timeout=30)
        if task.done():
            task.result()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def sqlite_sums(client: JournalClient, etcd: Etcd, spec: ShardSpec, root: Path
                      ) -> dict[str, int]:
    """The totals the shard's log holds: played (from the newest hints) into `root`
    and read with plain SQLite."""
    hints = next(h for _, h in await load_hints(etcd, spec) if h is not None)
    player = Player(client, hints.log, root, hints)
    await player.play()
    await player.finish()
    db = apsw.Connection(str(root / "store.db"))
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return dict(db.execute("SELECT key, n FROM sums").fetchall())
    finally:
        db.close()


async def test_a_sqlite_shard_survives_crashes_with_exact_sums(
        logs_client: JournalClient, etcd: Etcd, etcd_prefix: str, tmp_path: Path) -> None:
    client, spec = logs_client, log_spec(etcd_prefix, hint_backups=2)
    recovery = Recovery(etcd, tmp_path / "local")
    rng = random.Random(3)
    expected = dict.fromkeys(KEYS, 0)
    async with AppendQueue(client, resend=True) as out:
        for _ in range(4):
            producing = asyncio.create_task(produce(client, rng, 60))
            await run_to_crash(ShardRunner(spec, SQLiteSums(), client, out, recovery), 2)
            for key, n in (await producing).items():
                expected[key] += n
        # A last run catches up with everything; its playback progress is reported.
        runner = ShardRunner(spec, SQLiteSums(), client, out, recovery)
        progress: list[tuple[int, int]] = []
        runner.on_progress = lambda p: progress.append((p.played, p.to_play))
        head = await client.write_head("sums/input")
        task = asyncio.create_task(runner.run())
        try:
            await asyncio.wait_for(runner.shard.progress.wait_committed(
                {"sums/input": head}), 30)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert progress and progress[-1][0] == progress[-1][1] > 0
    assert await sqlite_sums(client, etcd, spec, tmp_path / "copy") == expected
    assert await committed_outputs(client) == expected
    # Hints: the primary's and two backups, each naming the log; the folder is gone.
    loaded = await load_hints(etcd, spec)
    assert [k for k, _ in loaded] == list(spec.hint_keys)
    assert all(h is not None and h.log == "logs/sums/shard-0" for _, h in loaded)
    assert not any((tmp_path / "local").iterdir())


async def test_bad_hints_fall_back_and_a_bad_log_fails_naming_shard_and_offset(
        logs_client: JournalClient, etcd: Etcd, etcd_prefix: str, tmp_path: Path) -> None:
    client, spec = logs_client, log_spec(etcd_prefix, hint_backups=1)
    recovery = Recovery(etcd, tmp_path / "local")
    async with AppendQueue(client, resend=True) as out:
        await produce(client, random.Random(4), 20)
        await run_to_crash(ShardRunner(spec, SQLiteSums(), client, out, recovery), 1)
        await run_to_crash(ShardRunner(spec, SQLiteSums(), client, out, recovery), 0)
        # The primary hints now point past the log's end: the backup is used.
        key = spec.hint_keys[0]
        hints = (await load_hints(etcd, spec))[0][1]
        assert hints is not None
        for segs in hints.live_nodes.values():
            segs[-1].last_offset += 1 << 30
        await etcd.put(key, hints.encode())
        await run_to_crash(ShardRunner(spec, SQLiteSums(), client, out, recovery), 0)

        # A log whose content is not frames: no hints can help; the error names the
        # shard and where the log is bad.
        await etcd.put(key, Hints("logs/sums/shard-0").encode())
        await etcd.put(spec.hint_keys[1], b"")
        await client.append("logs/sums/shard-0", b"garbage" * 10)
        runner = ShardRunner(spec, SQLiteSums(), client, out, recovery)
        with pytest.raises(PlaybackError,
                           match=r"shard sums/shard-0: playing recovery log "
                                 r"logs/sums/shard-0 at offset \d+: no frame starts here"):
            await runner.run()


async def test_a_missing_recovery_log_is_named(
        logs_client: JournalClient, etcd: Etcd, etcd_prefix: str, tmp_path: Path) -> None:
    spec = dataclasses.replace(log_spec(etcd_prefix), recovery_log_prefix="nowhere")
    runner = ShardRunner(spec, SQLiteSums(), logs_client, AppendQueue(logs_client),
                         Recovery(etcd, tmp_path))
    with pytest.raises(PlaybackError, match="shard sums/shard-0: its recovery log "
                       r"nowhere/sums/shard-0 does not exist \(create the journal\)"):
        await runner.run()


class LogSums(Stores):
    """Per-shard SQLite sums on the shards' recovery logs (what each member's copy
    holds is read back from the logs at the end)."""

    def app(self) -> Any:
        return SQLiteCounts()


class SQLiteCounts(Application):
    def new_store(self, shard: Shard) -> Any:
        return SQLiteStore(shard.folder)

    def begin_txn(self, shard: Shard, store: Any) -> None:
        store.db.execute("CREATE TABLE IF NOT EXISTS n (k INTEGER PRIMARY KEY, n INT)")

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        store.db.execute("INSERT INTO n VALUES (0, 1) ON CONFLICT (k) DO UPDATE "
                         "SET n = n + 1")


async def test_a_hot_standby_tails_and_takes_over_from_a_draining_primary(
        etcd_server: EtcdServer, consumer_root: str, broker: BrokerServer) -> None:
    await broker.apply_yaml(LOGS)
    stores = LogSums()
    members: list[ConsumerMember] = []
    seen: list[ReplicaStatus] = []
    try:
        members = await members_of(etcd_server, consumer_root, broker, stores, ["m0", "m1"])
        for m in members:
            report = m.statuses.set

            def spy(item: str, status: ReplicaStatus | None, report: Any = report) -> None:
                if status is not None:
                    seen.append(status)
                report(item, status)
            m.statuses.set = spy  # type: ignore[method-assign]
        layout = Layout.consumer_app("counter", consumer_root)
        await apply_changes(members[0].etcd, layout, [SpecChange("shard-0", 0, ShardSpec(
            "shard-0", (ShardSource("counts/in-0"),), recovery_log_prefix="logs",
            hint_prefix=f"{consumer_root}/hints", hot_standbys=1))])

        def states() -> dict[str, Any]:
            return {m.id.suffix: st.state for m in members
                    if (st := m.status("shard-0")) is not None}

        await eventually(lambda: sorted(states().values()) == [STANDBY, PRIMARY],
                         "a primary and a ready hot standby", timeout=30)
        async with JournalClient(broker.grpc_address) as client:
            sent = await publish(client, 400) // 4  # a quarter goes to counts/in-0
            first = next(m for m in members if m.status("shard-0").state == PRIMARY)
            other = next(m for m in members if m is not first)
            await eventually(lambda: first.shards.items["shard-0"].runner is not None and
                             first.shards.items["shard-0"].runner.shard.progress.messages
                             >= sent, "the primary counted the input", timeout=30)
            assert await first.drain(30)
            await eventually(lambda: primaries(members, ["shard-0"]) ==
                             {"shard-0": other.id.suffix}, "the standby took over",
                             timeout=30)
            sent += await publish(client, 400) // 4
            local = other.shards.items["shard-0"]
            await eventually(lambda: local.runner is not None and local.runner.store
                             is not None and local.runner.store.db.execute(  # type: ignore
                                 "SELECT n FROM n").fetchall() == [(sent,)],
                             "the new primary counted everything once", timeout=30)
        assert seen.index(ReplicaStatus(RECOVERING)) < seen.index(ReplicaStatus(STANDBY)), \
            "the standby showed itself recovering, then ready"
        async with ShardClient(f"127.0.0.1:{members[0].port}") as shards:
            hints = await shards.get_hints("shard-0")  # GetHints: from etcd
        assert hints.primary is not None and hints.primary.log == "logs/shard-0"
        assert Hints.from_pb(hints.primary).live_nodes, "the store's files are hinted"
    finally:
        for member in members:
            await member.stop()



async def test_a_zombie_primary_cut_off_from_etcd_cannot_commit_after_its_successor(
        etcd_server: EtcdServer, consumer_root: str, broker: BrokerServer,
        tmp_path: Path) -> None:
    # The zombie's etcd connection goes through a relay that is cut; it is never told
    # its lease ended (nothing here awaits its `wait()`), and its keyspace stays as it
    # was. A member stops its primaries once its own clock says its lease may have run
    # out; a stalled process (paused, swapped out) gets no chance to look: the zombie is
    # made one that never does, so it goes on reading and processing as primary, and
    # only the recovery log's fencing can stop its commits.
    await broker.apply_yaml(LOGS)
    members: list[ConsumerMember] = []
    async with Relay(etcd_server.endpoint.removeprefix("http://")) as relay:
        try:
            zombie = ConsumerMember(MemberConfig(
                "counter", zone="zone-a", suffix="zombie", host="127.0.0.1",
                bind="127.0.0.1", port=0, http_port=-1, broker_address=broker.grpc_address,
                etcd_address=f"http://{relay.address}", etcd_root=consumer_root,
                lease_ttl=2, drain_timeout=1, grace=0.5), SQLiteCounts())
            zombie.membership.live = lambda: True  # type: ignore[method-assign]
            members.append(zombie)
            await zombie.start()
            await apply_changes(zombie.etcd, Layout.consumer_app("counter", consumer_root), [
                SpecChange("shard-0", 0, ShardSpec(
                    "shard-0", (ShardSource("counts/in-0"),), recovery_log_prefix="logs",
                    hint_prefix=f"{consumer_root}/hints", hot_standbys=1))])
            await eventually(lambda: zombie.status("shard-0") == ReplicaStatus(PRIMARY),
                             "the zombie-to-be is primary", timeout=30)
            [successor] = await members_of(etcd_server, consumer_root, broker,
                                           LogSums(), ["successor"])
            members.append(successor)
            await eventually(lambda: successor.status("shard-0") == ReplicaStatus(STANDBY),
                             "a ready standby", timeout=30)
            async with JournalClient(broker.grpc_address) as client:
                sent = await publish(client, 200) // 4  # a quarter goes to counts/in-0
                runner = zombie.shards.items["shard-0"].runner
                assert runner is not None
                await eventually(lambda: runner.shard.progress.transactions > 0 and
                                 runner.shard.progress.messages >= sent,
                                 "the primary committed the input", timeout=30)

                relay.refuse = True
                relay.cut()
                await eventually(lambda: successor.status("shard-0") ==
                                 ReplicaStatus(PRIMARY), "the successor took over once "
                                 "the zombie's lease expired", timeout=30)
                assert zombie.status("shard-0") == ReplicaStatus(PRIMARY), \
                    "the zombie still thinks it is primary"

                # New input: the zombie reads it and commits, and its log append is
                # refused (a recorder with nothing new appends nothing: the refusal says
                # the zombie processed); the successor counts it.
                sent += await publish(client, 200) // 4
                zombie_status = lambda: zombie.status("shard-0")  # noqa: E731
                await eventually(lambda: zombie_status() is not None and
                                 zombie_status().state == FAILED,  # type: ignore[union-attr]
                                 "the zombie's commit failed", timeout=30)
                assert "fenced out" in zombie_status().error  # type: ignore[union-attr]
                local = successor.shards.items["shard-0"]
                await eventually(lambda: local.runner is not None and local.runner.store
                                 is not None and local.runner.store.db.execute(  # type: ignore
                                     "SELECT n FROM n").fetchall() == [(sent,)],
                                 "the successor counted everything once", timeout=30)
                # The log holds nothing of the zombie's: played afresh, the same count.
                assert local.runner is not None
                await asyncio.wait_for(local.runner.shard.progress.wait_committed(
                    {"counts/in-0": await client.write_head("counts/in-0")}), 30)
                player = Player(client, "logs/shard-0", tmp_path / "played")
                await player.play()
                await player.finish()
                db = apsw.Connection(str(tmp_path / "played" / "store.db"))
                try:
                    assert db.execute("SELECT n FROM n").fetchall() == [(sent,)]
                finally:
                    db.close()
        finally:
            relay.refuse = False
            for member in members:
                await member.stop()
