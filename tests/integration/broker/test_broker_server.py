"""The assembled broker (`BrokerServer`): member spec under a lease, gRPC health,
ListFragments, metadata-only reads with fragment URLs, and the HTTP gateway."""

from __future__ import annotations

import asyncio
import hashlib
import os
from datetime import timedelta

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gazette.fragment import fragment_from_pb
from gazette.keyspace import Etcd
from gazette.keyspace.specs import decode_broker
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol.convert import duration_to_pb
from gazette_broker import BrokerServer

pytestmark = pytest.mark.integration

JOURNAL = "example/journal"
HELLO = b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'


async def test_member_spec_lives_under_the_lease_and_goes_on_stop(
    broker_server: BrokerServer,
) -> None:
    cfg = broker_server.config
    key = broker_server.layout.member_key(cfg.zone, cfg.suffix)
    _, kv = await broker_server.etcd.get(key)
    assert broker_server.lease is not None
    assert kv is not None and kv.lease == broker_server.lease.id
    spec = decode_broker(kv.value)
    assert spec.endpoint == broker_server.endpoint
    async with grpc.aio.insecure_channel(broker_server.grpc_address) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    async with aiohttp.ClientSession() as http:
        async with http.get(broker_server.http_url + "/healthz") as r:
            assert r.status == 200
        async with http.get(broker_server.http_url + "/metrics") as r:
            assert r.status == 200 and "gazette_" in await r.text()
    await broker_server.stop()
    async with Etcd(cfg.etcd_address) as etcd:
        assert (await etcd.get(key))[1] is None


async def test_http_gateway_follows_the_tutorial(broker_server: BrokerServer) -> None:
    await broker_server.apply_yaml(TUTORIAL_JOURNALS_YAML)
    url = f"{broker_server.http_url}/{JOURNAL}"
    async with aiohttp.ClientSession() as http:
        async with http.put(url, data=HELLO) as r:
            assert r.status == 204, await r.text()
            assert r.headers["X-Gazette-Commit-Sha1"] == hashlib.sha1(HELLO).hexdigest()
        async with http.get(url) as r:
            assert r.status == 200 and await r.read() == HELLO
            assert r.headers["Content-Type"] == "application/x-ndjson"
        async with http.get(url + "?offset=16") as r:
            assert await r.read() == HELLO[16:]

        async def race(n: int) -> None:
            async with http.put(url, data=b'{"Msg": "Race!", "N": %d}\n' % n) as r:
                assert r.status == 204

        await asyncio.gather(*(race(n) for n in range(1, 21)))
        async with http.get(url) as r:
            lines = (await r.read()).splitlines()
        assert lines[:2] == HELLO.splitlines()
        assert sorted(lines[2:]) == sorted(b'{"Msg": "Race!", "N": %d}' % n
                                           for n in range(1, 21))

        # A blocking read from the write head sees appends made after it started.
        async with http.get(url + "?block=true&offset=-1") as r:
            assert r.status == 200
            async with http.put(url, data=b"later\n") as w:
                assert w.status == 204
            assert await asyncio.wait_for(r.content.readline(), 10) == b"later\n"


@pytest.mark.parametrize(("method", "path", "status", "reason"), [
    ("GET", "/no/such/journal", 404, "JOURNAL_NOT_FOUND"),
    ("PUT", "/no/such/journal", 404, "JOURNAL_NOT_FOUND"),
    ("GET", "/bad%20name", 400, "journal"),
    ("GET", f"/{JOURNAL}?offset=abc", 400, "offset"),
    ("GET", f"/{JOURNAL}?offset=-2", 400, "offset"),
    ("GET", f"/{JOURNAL}?block=maybe", 400, "block"),
    ("GET", f"/{JOURNAL}?offset=999", 416, "OFFSET_NOT_YET_AVAILABLE"),
])
async def test_http_errors_are_clear_and_the_broker_keeps_serving(
    broker_server: BrokerServer, method: str, path: str, status: int, reason: str,
) -> None:
    await broker_server.apply_yaml(TUTORIAL_JOURNALS_YAML)
    async with aiohttp.ClientSession() as http:
        async with http.request(method, broker_server.http_url + path, data=b"x\n") as r:
            assert r.status == status
            assert reason in await r.text()
        async with http.put(f"{broker_server.http_url}/{JOURNAL}", data=b"ok\n") as r:
            assert r.status == 204


async def test_http_put_cut_short_appends_nothing(broker_server: BrokerServer) -> None:
    await broker_server.apply_yaml(TUTORIAL_JOURNALS_YAML)
    replica = broker_server.broker.replicas[JOURNAL]
    host, port = broker_server.http_url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"PUT /{JOURNAL} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
                 .encode() + b"partial line\n")
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{broker_server.http_url}/{JOURNAL}", data=b"whole\n") as r:
            assert r.status == 204
        async with http.get(f"{broker_server.http_url}/{JOURNAL}") as r:
            assert await r.read() == b"whole\n"
    assert replica.write_head == len(b"whole\n")


async def test_http_blocking_reader_gone_away_ends_quietly(
    broker_server: BrokerServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """A blocking read whose client went away ends at the next append, without an error
    for the end of a response nobody reads any more."""
    await broker_server.apply_yaml(TUTORIAL_JOURNALS_YAML)
    url = f"{broker_server.http_url}/{JOURNAL}"
    assert broker_server.http is not None
    server = broker_server.http._runner.server
    assert server is not None
    async with aiohttp.ClientSession() as http, http.get(url + "?block=true&offset=-1") as r:
        assert r.status == 200
        async with http.put(url, data=b"first\n") as w:
            assert w.status == 204
        assert await asyncio.wait_for(r.content.readline(), 10) == b"first\n"
    deadline = asyncio.get_running_loop().time() + 10
    # Until the broker has seen the reader go (its handler lingers, waiting for content).
    while any(handler.transport is not None for handler in server.connections):
        assert asyncio.get_running_loop().time() < deadline, "the reader stays connected"
        await asyncio.sleep(0.01)
    async with aiohttp.ClientSession() as http, http.put(url, data=b"second\n") as w:
        assert w.status == 204  # wakes the gone reader's handler
    await broker_server.stop()  # waits for the handler
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


async def test_list_fragments_pages_and_signs(broker_server: BrokerServer) -> None:
    await broker_server.apply_yaml(TUTORIAL_JOURNALS_YAML)
    replica = broker_server.broker.replicas[JOURNAL]
    async with grpc.aio.insecure_channel(broker_server.grpc_address) as ch:
        stub = broker_pb2_grpc.JournalStub(ch)
        for i in range(3):
            resp = await stub.Append(iter([pb.AppendRequest(journal=JOURNAL),
                                           pb.AppendRequest(content=b"line %d\n" % i),
                                           pb.AppendRequest()]))
            assert resp.status == pb.OK
            await replica.roll()
        await replica.append(_one(b"open spool\n"))
        await asyncio.wait_for(broker_server.broker.persister.wait_idle(), 10)

        pages, token = [], 0
        while True:
            page = await stub.ListFragments(pb.FragmentsRequest(
                journal=JOURNAL, page_limit=2, next_page_token=token,
                signature_ttl=duration_to_pb(timedelta(minutes=5))))
            assert page.status == pb.OK
            pages.append(page)
            token = page.next_page_token
            if not token:
                break
        items = [item for p in pages for item in p.fragments]
        assert [len(p.fragments) for p in pages] == [2, 2]
        frags = [fragment_from_pb(i.spec) for i in items]
        assert [(f.begin, f.end) for f in frags] == [(0, 7), (7, 14), (14, 21), (21, 32)]
        assert all(f.backing_store and f.mod_time for f in frags[:3])
        assert not frags[3].backing_store and not items[3].signed_url
        for item, frag in zip(items[:3], frags[:3], strict=True):
            assert item.signed_url.startswith("file://")
            assert await asyncio.to_thread(os.path.exists,
                                           item.signed_url.removeprefix("file://")), frag

        # Metadata-only reads name the fragment and, when only a store has it, its URL.
        first = [r async for r in stub.Read(pb.ReadRequest(
            journal=JOURNAL, offset=3, metadata_only=True))]
        assert len(first) == 1 and first[0].status == pb.OK
        assert first[0].offset == 3 and first[0].fragment.end == 7
        assert first[0].fragment_url.startswith("file://") and not first[0].content
        head = [r async for r in stub.Read(pb.ReadRequest(
            journal=JOURNAL, offset=25, metadata_only=True))]
        assert head[0].fragment.begin == 21 and not head[0].fragment_url
        at_head = [r async for r in stub.Read(pb.ReadRequest(
            journal=JOURNAL, offset=-1, metadata_only=True))]
        assert at_head[0].status == pb.OFFSET_NOT_YET_AVAILABLE
        assert at_head[0].write_head == 32

        bad = stub.ListFragments(pb.FragmentsRequest(journal=JOURNAL, page_limit=-1))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bad
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "page_limit" in (err.value.details() or "")
        missing = await stub.ListFragments(pb.FragmentsRequest(journal="no/such"))
        assert missing.status == pb.JOURNAL_NOT_FOUND


async def _one(data: bytes):  # type: ignore[no-untyped-def]
    yield data
