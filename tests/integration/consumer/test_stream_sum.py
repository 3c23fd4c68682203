"""The stream-sum example over a real etcd and broker, with in-process consumer members:
every stream's sum is exact (MemoryStores across a hand-off, JSONFileStores across a
member's restart), a sum published while the last transaction commits is kept, a chunk
out of sequence fails its shard, the driver reports wrong, repeated and missing sums,
and the command sets up, drives and exits by the outcome."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import MemoryStore, ShardRunner
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.consumer.shard import FAILED, PRIMARY
from gazette.keyspace import Etcd
from gazette.message import Partition, Publisher
from gazette.protocol import ShardSource, ShardSpec
from gazette_broker import BrokerServer
from gazette_consumer.examples.stream_sum import (
    APP,
    CHUNKS,
    NDJSON,
    SUMS,
    Chunk,
    Driver,
    StreamSum,
    Sum,
    setup,
    shard_id,
)
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.polling import eventually
from tests.fixtures.procs import run_process

pytestmark = pytest.mark.integration

SHARDS = [shard_id(i) for i in range(4)]


@pytest.fixture
async def client(broker_server: BrokerServer, etcd: Etcd, consumer_root: str
                 ) -> AsyncIterator[JournalClient]:
    """A client of a broker with the stream-sum journals and shards set up."""
    async with JournalClient(broker_server.grpc_address) as c:
        await setup(c, etcd, etcd_root=consumer_root)
        yield c


class Members:
    """In-process members of stream-sum, stopped at the end."""

    def __init__(self, etcd: EtcdServer, root: str, broker: BrokerServer) -> None:
        self.etcd, self.root, self.broker = etcd, root, broker
        self.running: list[ConsumerMember] = []

    async def start(self, name: str, app: StreamSum) -> ConsumerMember:
        member = ConsumerMember(MemberConfig(
            APP, suffix=name, host="127.0.0.1", bind="127.0.0.1", port=0, http_port=0,
            broker_address=self.broker.grpc_address, etcd_address=self.etcd.endpoint,
            etcd_root=self.root, lease_ttl=5, drain_timeout=20, grace=1), app)
        self.running.append(member)
        await member.start()
        return member

    def primaries(self) -> dict[str, str]:
        return {s: m.id.suffix for m in self.running for s in SHARDS
                if (st := m.status(s)) is not None and st.state == PRIMARY}

    async def stop(self, member: ConsumerMember) -> None:
        self.running.remove(member)
        await member.stop()


@pytest.fixture
async def members(etcd_server: EtcdServer, consumer_root: str, broker_server: BrokerServer
                  ) -> AsyncIterator[Members]:
    group = Members(etcd_server, consumer_root, broker_server)
    try:
        yield group
    finally:
        for member in list(group.running):
            await group.stop(member)


async def test_every_sum_is_exact_across_a_hand_off(client: JournalClient,
                                                    members: Members) -> None:
    app = StreamSum()  # MemoryStores, kept by the app the two members share
    m0, _ = await members.start("m0", app), await members.start("m1", app)
    await eventually(lambda: len(members.primaries()) == 4, "every shard runs", 20)
    async with Driver(client, seed=1) as driver:
        await driver.publish(12, 15)
        assert await m0.drain(20)  # its shards move to m1 mid-way
        await eventually(lambda: set(members.primaries().values()) == {"m1"},
                         "m1 runs every shard", 20)
        await driver.publish(12, 15)
        summary = await driver.verify(30)
    assert summary.ok, summary.line()
    assert summary.exact == 24 and summary.transactions and summary.rolled_back \
        and summary.resent, summary.line()


async def test_json_file_stores_keep_sums_across_a_restart(
        client: JournalClient, members: Members, tmp_path: Path) -> None:
    member = await members.start("m0", StreamSum(directory=tmp_path / "sums"))
    await eventually(lambda: len(members.primaries()) == 4, "every shard runs", 20)
    async with Driver(client, seed=2) as driver:
        await driver.publish(10, 10)
        await members.stop(member)  # these streams wait in their journals meanwhile
        await driver.publish(10, 10)
        await members.start("m0", StreamSum(directory=tmp_path / "sums"))
        summary = await driver.verify(30)
    assert summary.ok, summary.line()
    states: dict[str, dict[str, int]] = {}
    for path in (tmp_path / "sums").glob("*.json"):
        states.update(json.loads(path.read_text())["state"])
    assert {s: (row["sum"], row["chunks"]) for s, row in states.items() if row["done"]} \
        == driver.expected


async def test_a_chunk_out_of_sequence_fails_its_shard(client: JournalClient,
                                                       members: Members) -> None:
    member = await members.start("m0", StreamSum())
    await eventually(lambda: len(members.primaries()) == 4, "every shard runs", 20)
    journal = f"{CHUNKS}part-000"
    async with AppendQueue(client) as queue:
        publisher = Publisher(queue)
        part = Partition(journal, NDJSON)
        for seq in (1, 2, 4):  # chunk 3 is missing
            publisher.publish_committed(lambda _: part, Chunk("gap", seq, [seq]))
        await queue.flush()

    def error() -> str:
        st = member.status(SHARDS[0])
        return st.error if st is not None and st.state == FAILED else ""

    await eventually(lambda: bool(error()), f"{SHARDS[0]} is FAILED", 20)
    assert f"SequenceError: shard {SHARDS[0]}: stream gap: chunk 4 follows chunk 2" \
        in error()
    assert set(members.primaries()) == set(SHARDS[1:]), "the others run on"


class HeldCommits(MemoryStore):
    """A MemoryStore whose commits also wait for `release`, as a slow database's do."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.started = 0

    def start_commit(self, checkpoint: Any, wait_for: Any) -> asyncio.Future[None]:
        self.started += 1
        return super().start_commit(checkpoint, [*wait_for, self.release.wait()])


async def test_a_sum_published_while_the_last_commit_runs_is_kept(
        client: JournalClient) -> None:
    """Transactions are pipelined: the next one publishes while the last one commits.
    The last one's ACKs, appended once it committed, must not roll back what the next
    one published before them."""
    store = HeldCommits()

    class App(StreamSum):
        def new_store(self, shard: Any) -> Any:
            return store

    runner = ShardRunner(ShardSpec(SHARDS[0], (ShardSource(f"{CHUNKS}part-000"),)),
                         App(), client, out := AppendQueue(client))
    part = Partition(f"{CHUNKS}part-000", NDJSON)
    task = asyncio.create_task(runner.run())
    try:
        async with Driver(client) as driver, AppendQueue(client) as queue:
            publisher = Publisher(queue)
            for stream in ("first", "second"):
                for chunk in (Chunk(stream, 1, [7]), Chunk(stream, 2, [])):
                    publisher.publish_committed(lambda _: part, chunk)
                await queue.flush()
                driver.expected[stream] = (7, 1)
                # "first": its transaction's commit starts, and is held; "second": the
                # next transaction consumes it (and publishes its sum) meanwhile.
                await eventually(lambda s=stream: s in store.state and store.state[s][
                    "done"], f"{stream} is summed", 20)
                assert store.started == 1 and runner.shard.progress.transactions == 0
            store.release.set()
            await eventually(lambda: runner.shard.progress.messages == 4,
                             "both transactions committed", 20)
            summary = await driver.verify(10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await out.close()
    assert summary.ok, summary.line()


async def test_the_driver_reports_wrong_repeated_and_missing_sums(
        client: JournalClient) -> None:
    """No consumer runs: the test writes the sums, one right, one wrong, one twice, one
    not at all (and one of a stream the driver did not send)."""
    async with Driver(client, seed=3) as driver:
        await driver.publish(4, 3)
        (s0, want0), (s1, want1), (s2, want2), (s3, _) = driver.expected.items()
        async with AppendQueue(client) as queue:
            publisher = Publisher(queue)
            part = Partition(SUMS, NDJSON)
            for sent in [Sum(s0, *want0), Sum(s1, want1[0] + 1, want1[1]), Sum(s2, *want2),
                         Sum(s2, *want2), Sum("another-run", 1, 1)]:
                publisher.publish_committed(lambda _: part, sent)
            await queue.flush()
        summary = await driver.verify(timeout=1)
    assert not summary.ok
    assert (summary.exact, summary.duplicated, summary.missing) == (1, [s2], [s3])
    assert summary.wrong == [f"{s1}: sum {want1[0] + 1} of 3 chunks, expected "
                             f"{want1[0]} of 3"]
    line = json.loads(summary.line())
    assert line["ok"] is False and line["missing"] == [s3]


async def test_the_command_sets_up_drives_and_exits_by_the_outcome(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        members: Members) -> None:
    argv = [sys.executable, "-m", "gazette_consumer.examples.stream_sum", "run",
            "--broker.address", broker_server.grpc_address, "--streams", "6",
            "--chunks", "5", "--seed", "4"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    # Nobody sums: every stream's sum is missing (setup runs first, with --etcd.address).
    code, out, err = await run_process(
        [*argv, "--timeout", "1", "--etcd.address", etcd_server.endpoint,
         "--etcd.prefix", consumer_root], env, timeout=60)
    line = json.loads(out.decode().strip().splitlines()[-1])
    assert (code, line["ok"], line["exact"], line["missing_count"]) == (1, False, 0, 6), err
    # A member sums them all: this run's sums are exact.
    await members.start("m0", StreamSum())
    code, out, err = await run_process([*argv, "--timeout", "30"], env, timeout=60)
    line = json.loads(out.decode().strip().splitlines()[-1])
    assert (code, line["ok"], line["exact"], line["streams"]) == (0, True, 6, 6), err
