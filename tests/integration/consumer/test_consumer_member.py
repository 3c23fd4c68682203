"""Consumer members on the cluster layer, in-process over a real etcd and broker: shards
are spread over the members by the allocator and run by their primaries; a draining
member hands its shards over and the sums stay exact; a shard whose source is missing is
FAILED with the reason while the others keep running."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from gazette.client import JournalClient
from gazette.consumer import Application, MemoryStore, Shard, SQLStore, Store
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.consumer.shard import FAILED
from gazette.keyspace import Layout, apply_changes
from gazette.message import Envelope, Publisher
from gazette.pb import consumer_pb2 as cpb
from gazette.pb import consumer_pb2_grpc
from gazette.protocol import ShardSource, ShardSpec, SpecChange
from gazette_broker import BrokerServer
from tests.fixtures.consumer import SHARDS, Group, Stores, Sums, members_of, primaries, publish
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

async def test_shards_spread_run_and_move_on_drain(
        group: Group, broker: BrokerServer) -> None:
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
        group: Group, broker: BrokerServer,
        consumer_root: str) -> None:
    members, stores = group
    layout = Layout.consumer_app("counter", consumer_root)
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

    # Its status is in etcd: either member's List shows it FAILED with the error, and
    # Unassign of failed replicas takes only it.
    for member in members:
        async with grpc.aio.insecure_channel(member.endpoint.removeprefix("http://")) as ch:
            stub = consumer_pb2_grpc.ShardStub(ch)

            async def listed_failure(stub: consumer_pb2_grpc.ShardStub = stub) -> str:
                resp = await stub.List(cpb.ListRequest())
                bad = next(s for s in resp.shards if s.spec.id == "shard-bad")
                return "".join(e for r in bad.status if r.code == cpb.ReplicaStatus.FAILED
                               for e in r.errors)

            await eventually(listed_failure, "List shows shard-bad FAILED", timeout=20)
            assert "counts/nope does not exist" in await listed_failure()
    async with grpc.aio.insecure_channel(members[0].endpoint.removeprefix("http://")) as ch:
        resp = await consumer_pb2_grpc.ShardStub(ch).Unassign(
            cpb.UnassignRequest(shards=[*SHARDS, "shard-bad"], only_failed=True))
    assert list(resp.shards) == ["shard-bad"]


async def test_an_application_error_is_logged_with_its_traceback_and_message(
        etcd_server: EtcdServer, consumer_root: str, broker: BrokerServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The shard's log line names the shard, the journal and offset of the message the
    application failed on, and carries the traceback down to the application's raise."""
    stores = Stores()

    class Fragile(Sums):
        def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                            publisher: Publisher) -> None:
            if envelope.message.get("key") == "boom":
                raise RuntimeError("cannot count this one")
            super().consume_message(shard, store, envelope, publisher)

    caplog.set_level(logging.ERROR, "gazette.consumer")
    members = await members_of(etcd_server, consumer_root, broker, stores, ["m0"],
                               lambda: Fragile(MemoryStore()))
    try:
        await apply_changes(members[0].etcd, Layout.consumer_app("counter", consumer_root),
                            [SpecChange("shard-x", 0, ShardSpec(
                                "shard-x", (ShardSource("counts/in-2"),)))])
        async with JournalClient(broker.grpc_address) as client:
            await client.append("counts/in-2", b'{"key": "k", "n": 1}\n')
            offset = await client.write_head("counts/in-2")
            await client.append("counts/in-2", b'{"key": "boom", "n": 1}\n')

        def failure() -> str:
            st = members[0].status("shard-x")
            return st.error if st is not None and st.state == FAILED else ""

        await eventually(lambda: bool(failure()), "shard-x is failed", timeout=20)
        error = failure()
    finally:
        for m in members:
            await m.stop()
    where = f"consume_message of counts/in-2 at offset {offset}"
    assert error == f"RuntimeError: cannot count this one ({where})"
    [record] = [r for r in caplog.records if "shard-x failed" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == f"shard shard-x failed: {error}"
    assert record.exc_info is not None
    trace = logging.Formatter().formatException(record.exc_info)
    assert 'raise RuntimeError("cannot count this one")' in trace, trace
    assert "in consume_message" in trace


async def test_a_busy_port_is_refused(etcd_server: EtcdServer, consumer_root: str,
                                      broker: BrokerServer) -> None:
    """A member on a port another gRPC server listens on (with gRPC's default
    SO_REUSEPORT, which would let the two share it and split the requests) fails at
    once, saying so."""
    other = grpc.aio.server()
    port = other.add_insecure_port("127.0.0.1:0")
    await other.start()
    try:
        member = ConsumerMember(MemberConfig(
            "counter", bind="127.0.0.1", port=port, http_port=-1,
            broker_address=broker.grpc_address,
            etcd_address=etcd_server.endpoint, etcd_root=consumer_root), Application())
        with pytest.raises(OSError, match=f"cannot listen for gRPC on 127.0.0.1:{port}: "
                                          r"the port is in use \(another consumer member"):
            await member.start()
    finally:
        await other.stop(None)


async def test_a_disabled_shard_is_not_assigned_until_enabled(
        group: Group, consumer_root: str) -> None:
    members, _ = group
    layout = Layout.consumer_app("counter", consumer_root)
    await eventually(lambda: len(primaries(members)) == 4, "every shard runs", timeout=20)
    spec = ShardSpec("shard-off", (ShardSource("counts/in-0"),), disable=True)
    witness = ShardSpec("shard-on", (ShardSource("counts/in-1"),))
    await apply_changes(members[0].etcd, layout, [SpecChange(spec.id, 0, spec),
                                                  SpecChange(witness.id, 0, witness)])
    # Once the allocator has assigned shard-on, it has seen shard-off too: a disabled
    # shard (replication 0) gets no assignment.
    await eventually(lambda: "shard-on" in primaries(members, ["shard-on"]),
                     "shard-on runs", timeout=20)
    assigned = (await members[0].etcd.get_prefix(layout.item_assignments(spec.id))).kvs
    assert [kv.key for kv in assigned] == []
    entry = members[0].keyspace.get(layout.item_key(spec.id))
    assert entry is not None
    enabled = ShardSpec("shard-off", (ShardSource("counts/in-0"),))
    await apply_changes(members[0].etcd, layout, [
        SpecChange(spec.id, entry.kv.mod_revision, enabled)])
    await eventually(lambda: "shard-off" in primaries(members, ["shard-off"]),
                     "shard-off runs once enabled", timeout=20)


async def test_a_store_that_cannot_connect_fails_its_shard_alone(
        etcd_server: EtcdServer, consumer_root: str, broker: BrokerServer) -> None:
    """The shard whose database cannot be reached is failed, its status naming why; the
    member keeps running its other shard."""
    stores = Stores()

    class OneBadStore(Sums):
        def new_store(self, shard: Shard) -> Store:
            if shard.id == "shard-db":
                return SQLStore("postgresql://nobody@127.0.0.1:1/nowhere", shard.id)
            return stores.by_shard.setdefault(shard.id, MemoryStore())

    members = await members_of(etcd_server, consumer_root, broker, stores, ["m0"],
                               lambda: OneBadStore(None))
    try:
        layout = Layout.consumer_app("counter", consumer_root)
        await apply_changes(members[0].etcd, layout, [
            SpecChange(s, 0, ShardSpec(s, (ShardSource(f"counts/in-{i}"),)))
            for i, s in enumerate(["shard-db", "shard-ok"])])

        def failure() -> str:
            st = members[0].status("shard-db")
            return st.error if st is not None and st.state == FAILED else ""

        await eventually(lambda: bool(failure()), "shard-db is failed", timeout=30)
        assert "OperationalError" in failure() and "127.0.0.1" in failure(), failure()
        await eventually(lambda: "shard-ok" in primaries(members, ["shard-ok"]),
                         "shard-ok runs", timeout=20)
        async with JournalClient(broker.grpc_address) as client:
            sent = await publish(client, 8)  # 2 to each input: counts/in-1 is shard-ok's
        await eventually(lambda: stores.total() == sent // 4, "shard-ok counts", timeout=20)
    finally:
        for m in members:
            await m.stop()
