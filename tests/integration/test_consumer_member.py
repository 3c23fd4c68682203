"""Consumer members on the cluster layer, in-process over a real etcd and broker: shards
are spread over the members by the allocator and run by their primaries; a draining
member hands its shards over and the sums stay exact; a shard whose source is missing is
FAILED with the reason while the others keep running."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.consumer.shard import FAILED, PRIMARY
from gazette.consumer.store import MemoryStore
from gazette.keyspace import Layout, apply_changes
from gazette.message import JsonMessage, Publisher
from gazette.protocol import ShardSource, ShardSpec, SpecChange
from gazette_broker import BrokerServer
from tests.fixtures.consumer import Sums, to
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

INPUTS = """
name: counts/
replication: 1
labels: [{name: content-type, value: application/x-ndjson}]
fragment:
  stores: ["file:///"]
children:
  - name: counts/in-0
  - name: counts/in-1
  - name: counts/in-2
  - name: counts/in-3
---
name: sums/output
replication: 1
labels: [{name: content-type, value: application/x-ndjson}]
fragment:
  stores: ["file:///"]
"""
SHARDS = [f"shard-{i}" for i in range(4)]


class Stores:
    """One MemoryStore per shard, shared by the members (as a remote database is)."""

    def __init__(self) -> None:
        self.by_shard: dict[str, MemoryStore] = {}

    def app(self) -> Any:
        stores = self

        class App(Sums):
            def new_store(self, shard: Any) -> Any:
                return stores.by_shard.setdefault(shard.id, MemoryStore())

        return App(None)

    def total(self) -> int:
        return sum(sum(s.committed.values()) for s in self.by_shard.values())


@pytest.fixture
async def broker(broker_server: BrokerServer) -> BrokerServer:
    await broker_server.apply_yaml(INPUTS)
    return broker_server


async def members_of(etcd: EtcdServer, prefix: str, broker: BrokerServer, stores: Stores,
                     names: list[str]) -> list[ConsumerMember]:
    out = []
    for i, name in enumerate(names):
        member = ConsumerMember(MemberConfig(
            "counter", zone=("zone-a", "zone-b")[i % 2], suffix=name, host="127.0.0.1",
            bind="127.0.0.1", port=0, broker_address=broker.grpc_address,
            etcd_address=etcd.endpoint, etcd_root=prefix, lease_ttl=5, drain_timeout=20,
            grace=1), stores.app())
        out.append(member)
        await member.start()
    return out


@pytest.fixture
async def group(etcd_server: EtcdServer, etcd_prefix: str, broker: BrokerServer
                ) -> AsyncIterator[tuple[list[ConsumerMember], Stores]]:
    stores = Stores()
    members: list[ConsumerMember] = []
    try:
        members = await members_of(etcd_server, etcd_prefix, broker, stores, ["m0", "m1"])
        layout = Layout.consumer_app("counter", etcd_prefix)
        await apply_changes(members[0].etcd, layout, [
            SpecChange(s, 0, ShardSpec(s, (ShardSource(f"counts/in-{i}"),)))
            for i, s in enumerate(SHARDS)])
        yield members, stores
    finally:
        for member in members:
            await member.stop()


def primaries(members: list[ConsumerMember]) -> dict[str, str]:
    return {shard: m.id.suffix for m in members for shard in SHARDS
            if (st := m.status(shard)) is not None and st.state == PRIMARY}


async def publish(client: JournalClient, n: int) -> int:
    """`n` messages of 1 to each input; returns their sum."""
    async with AppendQueue(client) as queue:
        publisher = Publisher(queue)
        for i in range(n):
            publisher.publish_committed(to(f"counts/in-{i % 4}"), JsonMessage(key="k", n=1))
        await queue.flush()
    return n


async def test_shards_spread_run_and_move_on_drain(
        group: tuple[list[ConsumerMember], Stores], broker: BrokerServer) -> None:
    members, stores = group
    await eventually(lambda: len(primaries(members)) == 4, "every shard has a primary",
                     timeout=20)
    assert set(primaries(members).values()) == {"m0", "m1"}, "spread over both members"
    async with JournalClient(broker.grpc_address) as client:
        sent = await publish(client, 200)
        await eventually(lambda: stores.total() == sent, "every message is counted",
                         timeout=20)
        # m0 drains: its shards move to m1, and what comes next is counted once.
        assert await members[0].drain(20)
        await eventually(lambda: primaries(members) == dict.fromkeys(SHARDS, "m1"),
                         "m1 runs every shard", timeout=20)
        sent += await publish(client, 200)
        await eventually(lambda: stores.total() == sent, "every message is counted once",
                         timeout=20)
    assert stores.total() == sent


async def test_a_shard_with_a_missing_source_fails_alone(
        group: tuple[list[ConsumerMember], Stores], broker: BrokerServer,
        etcd_prefix: str) -> None:
    members, stores = group
    layout = Layout.consumer_app("counter", etcd_prefix)
    await apply_changes(members[0].etcd, layout, [
        SpecChange("shard-bad", 0, ShardSpec("shard-bad", (ShardSource("counts/nope"),)))])

    def failed() -> str:
        return next((st.error for m in members if (st := m.status("shard-bad")) is not None
                     and st.state == FAILED), "")

    await eventually(lambda: bool(failed()), "shard-bad is FAILED", timeout=20)
    assert "shard shard-bad: source journal counts/nope does not exist" in failed()
    await eventually(lambda: len(primaries(members)) == 4, "the others run", timeout=20)
    async with JournalClient(broker.grpc_address) as client:
        sent = await publish(client, 40)
    await eventually(lambda: stores.total() == sent, "the others count", timeout=20)
