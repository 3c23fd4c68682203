"""Broker hardening in a cluster: three brokers in two zones, in-process (the numbers are
the items of the hardening issue; the others were found by the hardening fault test)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from gazette.allocator import assignments_of, route_of
from gazette.client import BrokerError, JournalClient
from gazette.keyspace import Txn
from gazette.local.etcd import EmbeddedEtcd
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette_broker import BrokerServer, pipeline, reads, replica_reads, replica_state
from tests.fixtures.broker import (
    applied,
    broker_config,
    consistent,
    read_all,
    started_broker,
)
from tests.fixtures.polling import eventually
from tests.fixtures.procs import run_process
from tests.fixtures.relay import Relay

pytestmark = pytest.mark.integration


def primary_of(cluster: list[BrokerServer], journal: str) -> BrokerServer:
    res = cluster[0].broker.resolver.resolve(journal)  # type: ignore[union-attr]
    return next(s for s in cluster if s.id == res.route.primary_id)


def primary_id(server: BrokerServer, journal: str) -> object:
    return route_of(assignments_of(server.keyspace, server.layout, journal)).primary_id


async def test_an_assignment_moved_to_another_slot_is_announced_again(
    cluster: list[BrokerServer],
) -> None:
    """Found by the fault test: the allocator moved a replica's assignment to another
    slot (a new key, without the route), the route itself unchanged, and the primary
    never announced it again: the journal stayed inconsistent for ever."""
    await applied(cluster)
    server = cluster[0]
    assigned = assignments_of(server.keyspace, server.layout, "cluster/r3")
    peer = next(a for a in assigned if a.slot != 0)
    lease = server.keyspace.get(peer.key)
    assert lease is not None
    moved = server.layout.assignment_key("cluster/r3", peer.member.zone, peer.member.suffix, 7)
    txn = Txn().expect(peer.key, peer.mod_revision).delete(peer.key)
    txn.expect(moved, 0).put(moved, b"", lease=lease.kv.lease)
    await txn.commit(server.etcd)
    await eventually(lambda: consistent(server, "cluster/r3", 3),
                     "every assignment holds the route again", 15)


async def test_an_uncertain_append_over_http_says_so(
    cluster: list[BrokerServer], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """5: a peer that takes the commit but whose answer never comes leaves the append
    uncertain; HTTP answers 504 saying it may or may not be written (the bug: the
    gateway caught the client's AppendUncertain, not the broker's, and answered 500)."""
    monkeypatch.setattr(pipeline, "PROPOSAL_TIMEOUT", 1.0)
    relays: dict[tuple[int, int], Relay] = {}
    for i, src in enumerate(cluster):
        for j, dst in enumerate(cluster):
            if i != j:
                relay = relays[i, j] = Relay(dst.grpc_address)
                await relay.__aenter__()
                # `src` reaches `dst` through the relay (its channel, made up front).
                src.broker.channels._channels[dst.endpoint] = grpc.aio.insecure_channel(
                    relay.address)
    try:
        await applied(cluster)
        primary = primary_of(cluster, "cluster/r3")
        p = cluster.index(primary)
        async with aiohttp.ClientSession() as http:
            url = f"{primary.http_url}/cluster/r3"
            async with http.put(url, data=b"before\n") as r:
                assert r.status == 204
            for (i, _), relay in relays.items():
                relay.hold_down = i == p  # peers' answers to the primary are held
            async with http.put(url, data=b"in doubt\n") as r:
                assert r.status == 504, await r.text()
                assert r.headers["X-Gazette-Outcome"] == "unknown"
                assert "may or may not have committed" in await r.text()
    finally:
        # Peers reach each other directly again, so the brokers' drains can hand their
        # journals over when the fixture stops them (through closed relays, each waited
        # its whole drain timeout).
        for src in cluster:
            for dst in cluster:
                channel = src.broker.channels._channels.pop(dst.endpoint, None) \
                    if dst is not src else None
                if channel is not None:
                    await channel.close()
        for relay in relays.values():
            await relay.__aexit__(None, None, None)


async def test_http_appends_ride_out_a_hand_off(cluster: list[BrokerServer]) -> None:
    """14: appends through a broker's gateway while the journal's primary is drained:
    each is retried until the new primary takes it (the bug: 1 in 5 answered 503 at
    once), and any failure says whether it wrote anything."""
    await applied(cluster)
    primary = primary_of(cluster, "cluster/r2")
    gateway = next(s for s in cluster if s is not primary)
    answers: list[tuple[int, str]] = []
    stop = asyncio.Event()

    async def put() -> None:
        async with aiohttp.ClientSession() as http:
            i = 0
            while not stop.is_set():
                async with http.put(f"{gateway.http_url}/cluster/r2",
                                    data=b"record %d\n" % i) as r:
                    answers.append((r.status, r.headers.get("X-Gazette-Outcome", "")))
                i += 1

    writers = [asyncio.create_task(put()) for _ in range(4)]
    try:
        await eventually(lambda: len(answers) > 20, "appends flow")
        await primary.stop()  # drained: the journal has another primary when it returns
        assert primary_id(gateway, "cluster/r2") not in (None, primary.id)
        count = len(answers)
        await eventually(lambda: len(answers) > count + 40, "appends flow after", 30)
    finally:
        stop.set()
        await asyncio.gather(*writers)
    failed = [a for a in answers if a[0] != 204]
    assert failed == [], f"appends failed during the hand-off: {failed[:5]}"


async def test_a_forwarded_append_cut_before_its_commit_says_nothing_was_written(
    cluster: list[BrokerServer],
) -> None:
    """10: the client's stream ended without its commit while a broker forwarded it (the
    bug: UNKNOWN, an error that says nothing)."""
    await applied(cluster)
    primary = primary_of(cluster, "cluster/r2")
    other = next(s for s in cluster if s is not primary)
    async with JournalClient(other.grpc_address) as client:
        await client.append("cluster/r2", b"committed\n")
    async with grpc.aio.insecure_channel(other.grpc_address) as ch:
        call = broker_pb2_grpc.JournalStub(ch).Append()
        await call.write(pb.AppendRequest(journal="cluster/r2"))
        await call.write(pb.AppendRequest(content=b"never committed"))
        await call.done_writing()  # no commit message
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
    assert err.value.code() == grpc.StatusCode.CANCELLED
    assert "nothing was appended" in (err.value.details() or "")
    assert await read_all(primary, "cluster/r2") == b"committed\n"


async def stopped_with_the_store_down(server: BrokerServer) -> None:
    """`server` drained and stopped, giving up its unpersisted content after a moment
    (its store is down: the test's point), not after the usual persist timeout."""
    server.config = dataclasses.replace(server.config, persist_timeout=0.5)
    await server.stop()


async def joined_past_a_gap(cluster: list[BrokerServer], tmp_path: Path, content: bytes
                            ) -> tuple[BrokerServer, Path, Path]:
    """cluster/r2 with `content` appended while its store was down (it stays down), then
    a replica drained: a newcomer joins its route past content only its peers hold.
    Returns the newcomer, and the store's path and where it was moved (to restore)."""
    store = tmp_path / "fragment-store"
    broken = tmp_path / "fragment-store.away"
    store.mkdir(exist_ok=True)
    await applied(cluster)
    members = [s for s in cluster if s.id in
               route_of(assignments_of(cluster[0].keyspace, cluster[0].layout,
                                       "cluster/r2")).members]
    newcomer = next(s for s in cluster if s not in members)
    leaving = next(s for s in members if s is not primary_of(cluster, "cluster/r2"))
    store.rename(broken)
    store.write_text("the store is down\n")  # uploads fail meanwhile
    async with JournalClient(leaving.grpc_address) as client:
        await client.append("cluster/r2", content)
    await stopped_with_the_store_down(leaving)  # the newcomer joins past content it
    # does not hold
    await eventually(lambda: consistent(newcomer, "cluster/r2", 2)
                     and newcomer.id in route_of(assignments_of(
                         newcomer.keyspace, newcomer.layout, "cluster/r2")).members,
                     "the newcomer joined", 30)
    return newcomer, store, broken


def store_back(store: Path, broken: Path) -> None:
    """The store is up again (brokers stopping at the test's end persist at once, instead
    of retrying a store that is down until their shutdown gives up)."""
    store.unlink()
    broken.rename(store)


async def test_a_new_replica_serves_its_gap_once_peers_persist_it(
    cluster: list[BrokerServer], tmp_path: Path,
) -> None:
    """Found by the fault test: a replica that joins a journal rolls past content only
    its peers hold; a read there that must be served by it alone (``do_not_proxy``),
    even non-blocking, waits until they persist it, instead of ending short (or, once
    the gap was old, skipping it)."""
    content = b"".join(b"record %d\n" % i for i in range(300))
    newcomer, store, broken = await joined_past_a_gap(cluster, tmp_path, content)
    reader = asyncio.create_task(read_all(newcomer, "cluster/r2"))
    await asyncio.sleep(1.0)  # the read must still be waiting in the gap after a while
    assert not reader.done(), "a read in a gap ended before the gap was persisted"
    store_back(store, broken)  # the peers' uploads go through
    assert (await asyncio.wait_for(reader, 60)).startswith(content)


async def test_a_read_through_a_new_replica_reads_its_gap_from_the_primary(
    cluster: list[BrokerServer], tmp_path: Path,
) -> None:
    """Found by the consumer fault test: a consumer reading through a broker that had
    just restarted waited in its replica's gap until the primary's spool rolled and
    was persisted (up to a minute: the test timed out). A read that may be forwarded
    reads the gap from the primary at once, and goes on from the replica after it."""
    content = b"".join(b"record %d\n" % i for i in range(300))
    newcomer, store, broken = await joined_past_a_gap(cluster, tmp_path, content)
    before = replica_reads.GAPS_FORWARDED._value.get()
    async with JournalClient(newcomer.grpc_address) as client:
        async with asyncio.timeout(10):
            assert b"".join([c.content async for c in client.read("cluster/r2")]) == content
        async with aiohttp.ClientSession() as http, \
                http.get(f"{newcomer.http_url}/cluster/r2") as resp:
            assert resp.status == 200
            assert await resp.read() == content
        # A blocking read from the start: the gap from the primary, then appends after it.
        async with contextlib.aclosing(client.read("cluster/r2", block=True)) as chunks:
            got = b""
            async with asyncio.timeout(10):
                async for chunk in chunks:
                    got += chunk.content
                    if got == content:
                        await client.append("cluster/r2", b"after the gap\n")
                    if got.endswith(b"after the gap\n"):
                        break
        assert got == content + b"after the gap\n"
    assert replica_reads.GAPS_FORWARDED._value.get() >= before + 3
    store_back(store, broken)


async def test_a_gap_the_primary_gave_up_too_is_read_past_once(
    cluster: list[BrokerServer], tmp_path: Path, etcd_server: EmbeddedEtcd,
    etcd_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the consumer fault test under a CPU hog: content that no live broker
    holds (its holders stopped before a store took it) is a gap on the primary and on a
    replica alike. A read through the replica read the gap from the primary, which gave
    it up after `GAP_WAIT_SECONDS` and read on past it, and the replica then read the
    same gap from it again, for ever. It goes on after the gap instead."""
    monkeypatch.setattr(reads, "GAP_WAIT_SECONDS", 1.0)
    content = b"".join(b"record %d\n" % i for i in range(300))
    newcomer, store, broken = await joined_past_a_gap(cluster, tmp_path, content)
    await stopped_with_the_store_down(primary_of(cluster, "cluster/r2"))  # the last
    # holder of `content` goes
    await eventually(lambda: primary_id(newcomer, "cluster/r2") == newcomer.id,
                     "the newcomer leads, with a gap no live broker holds", 30)
    async with started_broker(etcd_server, etcd_prefix, tmp_path, zone="zone-b",
                              suffix="b3", spool_dir=tmp_path / "spools-3") as joiner:
        await eventually(lambda: consistent(joiner, "cluster/r2", 2) and joiner.id in
                         route_of(assignments_of(joiner.keyspace, joiner.layout,
                                                 "cluster/r2")).members,
                         "a fresh broker joined", 30)
        async with JournalClient(newcomer.grpc_address) as client:
            await client.append("cluster/r2", b"after the gap\n")
        # Both hold the gap; the one that is not the primary reads it from the other.
        reader = joiner if primary_id(joiner, "cluster/r2") != joiner.id else newcomer
        before = replica_reads.GAPS_FORWARDED._value.get()
        async with JournalClient(reader.grpc_address) as client:
            async with asyncio.timeout(20):
                chunks = [c async for c in client.read("cluster/r2")]
        assert replica_reads.GAPS_FORWARDED._value.get() == before + 1
    assert b"".join(c.content for c in chunks) == b"after the gap\n"
    assert chunks[0].offset == len(content)  # the gap skipped, once
    store_back(store, broken)


async def test_a_peer_that_becomes_primary_persists_its_held_copies_at_once(
    cluster: list[BrokerServer], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the consumer fault test: a peer's closed spool waits before its upload
    (the primary uploads the same content); but a peer that becomes primary may hold
    content no one else does (an append in doubt that only it committed), and a crash
    in that wait left a hole that readers stalled in. It uploads at once instead."""
    monkeypatch.setattr(replica_state, "PEER_PERSIST_DELAY", 120.0)
    await applied(cluster)
    primary = primary_of(cluster, "cluster/r2")
    peer = next(s for s in cluster if s is not primary and s.id in route_of(
        assignments_of(cluster[0].keyspace, cluster[0].layout, "cluster/r2")).members)
    async with JournalClient(primary.grpc_address) as client:
        await client.append("cluster/r2", b"".join(b"record %d\n" % i for i in range(50)))
    await primary.broker.replicas["cluster/r2"].roll()  # the peer rolls with it
    await eventually(lambda: not peer.broker.persister.idle, "the peer holds its copy")
    await primary.stop()  # drained: the peer is the journal's primary next
    await eventually(lambda: primary_id(peer, "cluster/r2") == peer.id, "the peer leads",
                     30)
    await eventually(lambda: peer.broker.persister.idle,
                     "the new primary's held copy is done with", 10)


async def test_journals_go_only_to_brokers_that_can_serve_their_stores(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    """16: a broker without --broker.file-root was assigned file:/// journals, whose
    appends then failed for 23 s; now it advertises the stores it serves."""
    with_root = BrokerServer(broker_config(etcd_server.endpoint, etcd_prefix, tmp_path / "a",
                                           suffix="with-root"))
    without = BrokerServer(broker_config(etcd_server.endpoint, etcd_prefix, tmp_path / "b",
                                         suffix="without-root", file_root=None))
    await with_root.start()
    await without.start()
    try:
        yaml = "name: kinds/\nreplication: 1\nchildren:\n" + "".join(
            f"  - name: kinds/file-{i}\n    fragment: {{stores: [file:///]}}\n"
            for i in range(6)) + "".join(
            f"  - name: kinds/none-{i}\n" for i in range(6))
        started = time.monotonic()
        await with_root.apply_yaml(yaml, timeout=20)
        holders = {j: route_of(assignments_of(with_root.keyspace, with_root.layout,
                                              j)).primary_id
                   for j in [f"kinds/{k}-{i}" for k in ("file", "none") for i in range(6)]}
        assert {holders[f"kinds/file-{i}"] for i in range(6)} == {with_root.id}
        assert without.id in {holders[f"kinds/none-{i}"] for i in range(6)}  # balanced
        async with JournalClient(without.grpc_address) as client:
            for i in range(6):
                await client.append(f"kinds/file-{i}", b"stored\n")
        assert time.monotonic() - started < 15
    finally:
        await without.stop()
        await with_root.stop()


async def test_refusals_keep_their_reason_through_clients_and_forwards(
    cluster: list[BrokerServer], tmp_path: Path,
) -> None:
    """18: an oversize or forbidden append said only NOT_ALLOWED through the client and
    gazctl; a forwarded oversize chunked PUT answered 403 instead of 413; a read offset
    past int64 answered 416 instead of 400."""
    await applied(cluster)
    for server in cluster:
        server.broker.shared.max_append_size = 1000
        for replica in server.broker.replicas.values():
            replica.max_append_size = 1000
    primary = primary_of(cluster, "cluster/r2")
    other = next(s for s in cluster if s is not primary)
    async with JournalClient(other.grpc_address) as client:
        with pytest.raises(BrokerError) as err:
            await client.append("cluster/r2", b"x" * 2000)
    assert err.value.status == "APPEND_TOO_LARGE"
    assert "larger than the 1000-byte limit" in str(err.value)

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"y" * 600

    async with aiohttp.ClientSession() as http:
        # No Content-Length (chunked), and through a broker that forwards it.
        async with http.put(f"{other.http_url}/cluster/r2", data=chunked()) as r:
            assert r.status == 413, await r.text()
            assert "larger than the 1000-byte limit" in await r.text()
        async with http.get(f"{other.http_url}/cluster/r2",
                            params={"offset": "99999999999999999999999"}) as r:
            assert r.status == 400 and "offset: must be at most" in await r.text()
    env = dict(os.environ, BROKER_ADDRESS=other.grpc_address)
    status, _, stderr = await run_process(
        [sys.executable, "-m", "gazette.gazctl", "journals", "append", "cluster/r2",
         "--framing", "none"], env, stdin=b"z" * 2000)
    assert status == 1 and "larger than the 1000-byte limit" in stderr, stderr
