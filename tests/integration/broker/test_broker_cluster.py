"""Three brokers in two zones, in-process, over one etcd and one fragment store: journals
are assigned by the allocator, appends replicate to every peer, any broker takes any
request, and a draining broker hands its journals over without losing an append."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gazette.client import AppendUncertain, JournalClient
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette_broker import BrokerServer
from tests.fixtures.broker import applied, consistent, read_all
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

async def test_appends_replicate_to_every_replica_through_any_broker(
    cluster: list[BrokerServer],
) -> None:
    await applied(cluster)
    expected = bytearray()
    for i in range(30):
        server = cluster[i % 3]  # whichever broker: it forwards to the primary
        async with JournalClient(server.endpoint) as client:
            record = f"record {i} via {server.id}\n".encode() * (i + 1)
            result = await client.append("cluster/r3", record)
            assert result.commit.begin == len(expected)
            expected += record
    for server in cluster:  # every replica holds the same bytes
        assert await read_all(server, "cluster/r3") == bytes(expected)
    # Reads through a broker that holds no replica of r2 are forwarded.
    async with JournalClient(cluster[0].endpoint) as client:
        await client.append("cluster/r2", b"two copies\n")
        for server in cluster:
            async with JournalClient(server.endpoint) as c:
                chunks = [c.content async for c in c.read("cluster/r2", 0)]
                assert b"".join(chunks) == b"two copies\n"


async def test_do_not_proxy_answers_with_the_route(cluster: list[BrokerServer]) -> None:
    await applied(cluster)
    res = cluster[0].broker.resolver.resolve("cluster/r3")  # type: ignore[union-attr]
    others = [s for s in cluster if s.id != res.route.primary_id]
    async with grpc.aio.insecure_channel(others[0].grpc_address) as ch:
        stub = broker_pb2_grpc.JournalStub(ch)
        resp = await stub.AppendWhole(pb.AppendRequest(
            journal="cluster/r3", content=b"x", do_not_proxy=True))
        assert resp.status == pb.NOT_JOURNAL_PRIMARY_BROKER
        assert len(resp.header.route.members) == 3
        primary = resp.header.route.members[resp.header.route.primary]
        assert (primary.zone, primary.suffix) == (res.route.primary_id.zone,  # type: ignore[union-attr]
                                                  res.route.primary_id.suffix)  # type: ignore[union-attr]
        assert resp.header.route.endpoints[resp.header.route.primary] == \
            res.primary_endpoint


async def test_a_draining_primary_hands_its_journal_over_without_loss(
    cluster: list[BrokerServer],
) -> None:
    await applied(cluster)
    res = cluster[0].broker.resolver.resolve("cluster/r2")  # type: ignore[union-attr]
    primary = next(s for s in cluster if s.id == res.route.primary_id)
    writer_at = next(s for s in cluster if s is not primary)
    written: list[bytes] = []  # acknowledged
    uncertain: set[bytes] = set()  # in flight while the primary moved: maybe written
    stop = asyncio.Event()

    async def write() -> None:
        async with JournalClient(writer_at.endpoint) as client:
            i = 0
            while not stop.is_set():
                record = f"record {i}\n".encode()
                try:
                    await client.append("cluster/r2", record)
                    written.append(record)
                except AppendUncertain:
                    uncertain.add(record)
                i += 1

    writer = asyncio.create_task(write())
    try:
        await eventually(lambda: len(written) > 20, "appends flow")
        await primary.stop()  # drains: its journals move first
        await eventually(lambda: len(written) > 60, "appends flow after the hand-off", 30)
    finally:
        stop.set()
        await writer
    survivors = [s for s in cluster if s is not primary]
    res = survivors[0].broker.resolver.resolve("cluster/r2")  # type: ignore[union-attr]
    assert primary.id not in res.route.members
    async with JournalClient(writer_at.endpoint) as client:
        content = b"".join([c.content async for c in client.read("cluster/r2", 0)])
    tail = content[-200:]
    for server in survivors:
        if server.id in res.route.members:  # both replicas hold the latest appends
            assert await read_all(server, "cluster/r2", len(content) - len(tail)) == tail
    records = content.splitlines(keepends=True)
    assert len(uncertain) <= 1, uncertain  # only an append caught by the hand-off
    assert [r for r in records if r not in uncertain] == written  # once each, in order


async def test_too_few_brokers_refuse_appends_with_a_status(
    cluster: list[BrokerServer],
) -> None:
    await applied(cluster)
    await cluster[2].stop()  # zone-b leaves: r3 can only have two brokers now
    await eventually(lambda: consistent(cluster[0], "cluster/r3", 2), "shrunk to two", 20)
    async with grpc.aio.insecure_channel(cluster[0].grpc_address) as ch:
        stub = broker_pb2_grpc.JournalStub(ch)
        resp = await stub.AppendWhole(pb.AppendRequest(journal="cluster/r3", content=b"x"))
        assert resp.status == pb.INSUFFICIENT_JOURNAL_BROKERS


async def test_the_http_gateway_of_any_broker_serves_any_journal(
    cluster: list[BrokerServer],
) -> None:
    import aiohttp

    await applied(cluster)
    res = cluster[0].broker.resolver.resolve("cluster/r2")  # type: ignore[union-attr]
    outsider = next(s for s in cluster if s.id not in res.route.members)
    follower = next(s for s in cluster if s.id in res.route.members
                    and s.id != res.route.primary_id)
    async with aiohttp.ClientSession() as http:
        for server in (outsider, follower):
            async with http.put(f"{server.http_url}/cluster/r2", data=b"via http\n") as r:
                assert r.status == 204, await r.text()
        async with http.get(f"{outsider.http_url}/cluster/r2") as r:
            assert r.status == 200 and await r.read() == b"via http\n" * 2
        async with http.get(f"{outsider.http_url}/cluster/r2?offset=18") as r:
            assert r.status == 416, await r.text()


async def test_a_request_made_on_a_stale_route_is_rerouted(
    cluster: list[BrokerServer],
) -> None:
    await applied(cluster)
    old = cluster[0].broker.resolver.resolve("cluster/r2")  # type: ignore[union-attr]
    stale_header = cluster[0].broker.resolver.header(old)  # type: ignore[union-attr]
    old_primary = next(s for s in cluster if s.id == old.route.primary_id)
    await old_primary.stop()  # the journal moves on
    survivors = [s for s in cluster if s is not old_primary]
    await eventually(lambda: consistent(survivors[0], "cluster/r2", 2)
                     and old_primary.id not in survivors[0].broker.resolver.resolve(  # type: ignore[union-attr]
                         "cluster/r2").route.members, "the route changed", 20)
    for server in survivors:
        async with grpc.aio.insecure_channel(server.grpc_address) as ch:
            stub = broker_pb2_grpc.JournalStub(ch)
            # Made against the old route and revision: served on the current one.
            resp = await stub.AppendWhole(pb.AppendRequest(
                journal="cluster/r2", header=stale_header, content=b"late\n"))
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
            assert resp.header.etcd.revision > stale_header.etcd.revision
            got = [r async for r in stub.Read(pb.ReadRequest(
                journal="cluster/r2", header=stale_header, offset=resp.commit.begin))]
            assert got[0].status == pb.OK and b"late\n" in b"".join(r.content for r in got)


async def test_registers_survive_a_change_of_primary(cluster: list[BrokerServer]) -> None:
    from gazette.client import BrokerError
    from gazette.labels import LabelSet, Selector

    await applied(cluster)
    res = cluster[0].broker.resolver.resolve("cluster/r3")  # type: ignore[union-attr]
    old_primary = next(s for s in cluster if s.id == res.route.primary_id)
    other = next(s for s in cluster if s is not old_primary)
    async with JournalClient(other.endpoint) as client:
        await client.append("cluster/r3", b"fence\n", union_registers=LabelSet([("owner", "me")]))
        res = other.broker.resolver.resolve("cluster/r3")  # type: ignore[union-attr]
        # Make another replica primary: the old primary drains away (r3 on three
        # brokers: the journal is short of a broker until it is back, then rolls).
        await old_primary.stop()
        await eventually(lambda: other.broker.resolver.resolve(  # type: ignore[union-attr]
            "cluster/r3").route.primary_id not in (None, old_primary.id), "a new primary", 20)
        replacement = BrokerServer(old_primary.config)
        cluster.append(replacement)  # stopped by the fixture
        await replacement.start()
        await eventually(lambda: consistent(other, "cluster/r3", 3), "three again", 20)
        # The new primary took the registers from its peers: fencing still holds.
        await client.append("cluster/r3", b"owner\n", check_registers=Selector.parse("owner=me"))
        with pytest.raises(BrokerError, match="REGISTER_MISMATCH"):
            await client.append("cluster/r3", b"x\n", check_registers=Selector.parse("owner=you"))


async def test_bad_replication_streams_get_clear_answers(cluster: list[BrokerServer]) -> None:
    await applied(cluster)
    res = cluster[0].broker.resolver.resolve("cluster/r3")  # type: ignore[union-attr]
    peer = next(s for s in cluster if s.id != res.route.primary_id)
    header = peer.broker.resolver.header(res)  # type: ignore[union-attr]
    async with grpc.aio.insecure_channel(peer.grpc_address) as ch:
        stub = broker_pb2_grpc.JournalStub(ch)

        async def first_reply(request: pb.ReplicateRequest) -> pb.ReplicateResponse:
            call = stub.Replicate()
            await call.write(request)
            reply = await call.read()
            call.cancel()
            return reply  # type: ignore[no-any-return]

        # A route this broker does not have: WRONG_ROUTE, with its own route.
        stale = pb.Header()
        stale.CopyFrom(header)
        del stale.route.members[0]
        del stale.route.endpoints[0]
        stale.route.primary = 0
        reply = await first_reply(pb.ReplicateRequest(header=stale, journal="cluster/r3"))
        assert reply.status == pb.WRONG_ROUTE
        assert len(reply.header.route.members) == 3
        # A proposal that is not what the peer holds: PROPOSAL_MISMATCH, with what it holds.
        held = peer.broker.replicas["cluster/r3"].spool.fragment
        reply = await first_reply(pb.ReplicateRequest(
            header=header, journal="cluster/r3", acknowledge=True,
            proposal=pb.Fragment(journal="cluster/r3", begin=held.end, end=held.end + 10,
                                 sha1=b"\x01" * 20, compression_codec=pb.NONE)))
        assert reply.status == pb.PROPOSAL_MISMATCH
        assert (reply.fragment.begin, reply.fragment.end) == (held.begin, held.end)
        # Malformed: a bad journal name, a bad proposal.
        for request, field in [
            (pb.ReplicateRequest(header=header, journal="bad name"), "journal"),
            (pb.ReplicateRequest(header=header, journal="cluster/r3", proposal=pb.Fragment(
                journal="cluster/r3", begin=5, end=1, compression_codec=pb.NONE)),
             "proposal"),
        ]:
            call = stub.Replicate()
            await call.write(request)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in (err.value.details() or "")
        # The peer still serves its primary: appends replicate as before.
        async with JournalClient(peer.endpoint) as client:
            await client.append("cluster/r3", b"still fine\n")
        assert (await read_all(peer, "cluster/r3")).endswith(b"still fine\n")


async def test_a_routing_client_appends_straight_to_the_primary(
    cluster: list[BrokerServer],
) -> None:
    from prometheus_client import REGISTRY

    def forwarded() -> float:
        return REGISTRY.get_sample_value("gazette_forwarded_total",
                                         {"rpc": "Append"}) or 0.0

    await applied(cluster)
    res = cluster[0].broker.resolver.resolve("cluster/r2")  # type: ignore[union-attr]
    outsider = next(s for s in cluster if s.id not in res.route.members)
    before = forwarded()
    async with JournalClient(outsider.endpoint, route_appends=True) as client:
        for i in range(20):
            await client.append("cluster/r2", f"direct {i}\n".encode())
        # The first append was forwarded and named the primary; the rest went there.
        assert forwarded() - before == 1
        # The primary leaves: the client falls back, learns the new one, goes on.
        primary = next(s for s in cluster if s.id == res.route.primary_id)
        await primary.stop()
        for i in range(20, 40):
            await client.append("cluster/r2", f"direct {i}\n".encode())
        content = b"".join([c.content async for c in client.read("cluster/r2", 0)])
    assert content == b"".join(f"direct {i}\n".encode() for i in range(40))
