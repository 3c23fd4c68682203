"""The Shard gRPC service of consumer members, over a real etcd and broker: Stat with
read-through from any member (forwarded to the primary), List by selector with routes,
Apply guarded by revisions, GetHints, Unassign, and clear refusals of bad input."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer.member import ConsumerMember
from gazette.message import JsonMessage, Publisher
from gazette.pb import broker_pb2 as bpb
from gazette.pb import consumer_pb2 as cpb
from gazette.pb import consumer_pb2_grpc
from gazette.protocol import ShardSource, ShardSpec, shard_spec_to_pb
from gazette_broker import BrokerServer
from tests.fixtures.consumer import SHARDS, Group, Stores, members_of, primaries, to
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.member_app import PROBE, TOTAL_PATH, RoutedSums
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration


def stub(member: ConsumerMember) -> tuple[grpc.aio.Channel, consumer_pb2_grpc.ShardStub]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{member.port}")
    return channel, consumer_pb2_grpc.ShardStub(channel)


async def test_stat_reads_through_from_any_member(group: Group, broker: BrokerServer
                                                  ) -> None:
    members, _ = group
    await eventually(lambda: len(primaries(members)) == 4, "every shard has a primary",
                     timeout=20)
    async with JournalClient(broker.grpc_address) as client, AppendQueue(client) as queue:
        result = await Publisher(queue).publish_committed(
            to("counts/in-2"), JsonMessage(key="k", n=7))
    end = result.commit.end
    for member in members:  # one serves shard-2, the other forwards to it
        channel, shard = stub(member)
        async with channel:
            resp = await shard.Stat(cpb.StatRequest(
                shard="shard-2", read_through={"counts/in-2": end}), timeout=20)
            assert resp.status == cpb.OK
            assert resp.read_through["counts/in-2"] >= end
            primary = resp.header.route.members[resp.header.route.primary]
            assert primary.suffix == primaries(members)["shard-2"]
            missing = await shard.Stat(cpb.StatRequest(shard="shard-x"))
            assert missing.status == cpb.SHARD_NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await shard.Stat(cpb.StatRequest(shard="bad#id"))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "shard" in (err.value.details() or "")
    # A Stat carrying a header was forwarded already: a non-primary refuses it.
    other = next(m for m in members if m.id.suffix != primaries(members)["shard-2"])
    channel, shard = stub(other)
    async with channel:
        resp = await shard.Stat(cpb.StatRequest(
            shard="shard-2", header=bpb.Header(etcd=bpb.Header.Etcd(revision=1))))
        assert resp.status == cpb.NOT_SHARD_PRIMARY
        assert len(resp.header.route.members) == 1


async def test_list_apply_hints_and_unassign(group: Group) -> None:
    members, _ = group
    await eventually(lambda: len(primaries(members)) == 4, "every shard has a primary",
                     timeout=20)
    channel, shard = stub(members[0])
    async with channel:
        listed = await shard.List(cpb.ListRequest())
        assert [s.spec.id for s in listed.shards] == SHARDS
        one = await shard.List(cpb.ListRequest(selector=bpb.LabelSelector(
            include=bpb.LabelSet(labels=[bpb.Label(name="id", value="shard-1")]))))
        assert [s.spec.id for s in one.shards] == ["shard-1"]
        assert all(len(s.route.members) == 1 for s in listed.shards)

        async def all_primary() -> bool:  # as each member wrote into etcd, whoever serves
            listed = await shard.List(cpb.ListRequest())
            return all([r.code for r in s.status] == [cpb.ReplicaStatus.PRIMARY]
                       for s in listed.shards)

        await eventually(all_primary, "every shard's status is PRIMARY", timeout=20)

        spec = ShardSpec("shard-4", (ShardSource("counts/in-0"),))
        applied = await shard.Apply(cpb.ApplyRequest(changes=[
            cpb.ApplyRequest.Change(upsert=shard_spec_to_pb(spec))]))
        assert applied.status == cpb.OK
        again = await shard.Apply(cpb.ApplyRequest(changes=[  # expects it to be new
            cpb.ApplyRequest.Change(upsert=shard_spec_to_pb(spec))]))
        assert again.status == cpb.ETCD_TRANSACTION_FAILED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await shard.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(
                upsert=cpb.ShardSpec(id="shard-5"))]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "changes[0].upsert" in (err.value.details() or "")
        await eventually(lambda: "shard-4" in primaries(members) or any(
            "shard-4" in m.shards.items for m in members), "shard-4 is assigned", timeout=20)

        hints = await shard.GetHints(cpb.GetHintsRequest(shard="shard-1"))
        assert hints.status == cpb.OK and not hints.HasField("primary_hints")
        assert (await shard.GetHints(cpb.GetHintsRequest(shard="nope"))).status == \
            cpb.SHARD_NOT_FOUND

        dry = await shard.Unassign(cpb.UnassignRequest(shards=["shard-0"], dry_run=True))
        assert list(dry.shards) == ["shard-0"]
        before = primaries(members)
        failed_only = await shard.Unassign(cpb.UnassignRequest(shards=SHARDS,
                                                               only_failed=True))
        assert list(failed_only.shards) == []  # none failed
        done = await shard.Unassign(cpb.UnassignRequest(shards=["shard-0"]))
        assert list(done.shards) == ["shard-0"]
        await eventually(lambda: "shard-0" in primaries(members), "shard-0 runs again",
                         timeout=20)
        assert set(primaries(members)) >= set(before)


async def test_malformed_request_messages_are_invalid_argument_naming_the_field(
        group: Group) -> None:
    members, _ = group
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{members[0].port}")
    async with channel:
        # Raw bytes, as a careless or hostile client sends them: grpc's own answer was
        # UNKNOWN ("Unexpected <class 'DecodeError'>") with a traceback logged.
        stat = channel.unary_unary("/gazette.consumer.Shard/Stat")
        bad_utf8 = b"\x12\x03a\xffb"  # field 2 (shard), 3 bytes, not UTF-8
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stat(bad_utf8, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "shard: not valid UTF-8 (byte 1)"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stat(b"\x12\xff\xff\xff\xff\x0f", timeout=10)  # a 4 GiB length
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "shard: its length" in (err.value.details() or "")
        # And the member serves on.
        ok = await consumer_pb2_grpc.ShardStub(channel).List(cpb.ListRequest(), timeout=10)
        assert ok.status == cpb.OK


async def test_an_applications_services_refuse_malformed_requests_naming_the_field(
        etcd_server: EtcdServer, consumer_root: str, broker: BrokerServer) -> None:
    """Services an application adds (a protobuf service registered as generated code
    registers one, a shard method of raw bytes) and the health service are behind the
    same guard as the Shard service: INVALID_ARGUMENT naming the field, at once."""
    [member] = await members_of(etcd_server, consumer_root, broker, Stores(), ["m0"],
                                RoutedSums)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{member.port}") as channel:
            cases: list[tuple[str, Any, str]] = [
                # grpc's own answers were UNKNOWN ("Unexpected <class 'DecodeError'>").
                (f"/{PROBE}/Echo", b"\x12\x03a\xffb", "shard: not valid UTF-8 (byte 1)"),
                (f"/{PROBE}/Gather", [b"\x12\x01a", b"\x1a\x05\x0a\x01j\x10"],
                 "read_through[0]: its length (5) runs past the end of the message"),
                ("/grpc.health.v1.Health/Check", b"\x0a\x02\xff\xfe",
                 "service: not valid UTF-8 (byte 0)"),
                # A stream without its one message was never answered (a hang).
                (TOTAL_PATH, [], "request: the stream ended before a whole request "
                                 "message"),
                # What the application's shard_of raised was UNKNOWN.
                (TOTAL_PATH, b"[" * 100_000, "request: cannot tell its shard "
                                             "(RecursionError: "),
                (TOTAL_PATH, json.dumps({"shard": "a\nb", "key": "k"}).encode(), "shard: "),
            ]
            for path, request, reason in cases:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    if isinstance(request, list):
                        await channel.stream_unary(path)(iter(request), timeout=5)
                    else:
                        await channel.unary_unary(path)(request, timeout=5)
                assert (err.value.code(), (err.value.details() or "")[:len(reason)]) == (
                    grpc.StatusCode.INVALID_ARGUMENT, reason), path
            # And the member serves on.
            echo = channel.unary_unary(f"/{PROBE}/Echo",
                                       request_serializer=cpb.StatRequest.SerializeToString,
                                       response_deserializer=cpb.StatResponse.FromString)
            ok = await echo(cpb.StatRequest(shard="shard-0", read_through={"j": 3}),
                            timeout=10)
            assert ok.status == cpb.OK and dict(ok.read_through) == {"j": 3}
    finally:
        await member.stop()
