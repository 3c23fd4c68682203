"""The broker's data path (``--broker.data-port``, `gazette.protocol.frames`): a
`JournalClient` learns a journal's primary's data endpoint from a response and sends
its appends there, pipelined on one connection and answered in order, with the same
offsets, registers, routing answers and authorization as gRPC; hostile and careless
input gets a clear refusal and the broker keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gazette.auth import Capability
from gazette.client import AppendQueue, BrokerError, JournalClient
from gazette.fragment import NO_SHA1
from gazette.keyspace.specs import decode_broker
from gazette.local.etcd import EmbeddedEtcd
from gazette.pb import broker_pb2 as pb
from gazette.protocol import frames, journal_changes_from_yaml
from gazette.protocol.frames import Kind
from gazette_broker import BrokerServer, framed
from tests.fixtures.broker import started_broker
from tests.fixtures.security import ClusterSecurity, token
from tests.fixtures.wire import append_frame

pytestmark = pytest.mark.integration

SPECS = """
name: data/
replication: 1
fragment: {stores: ["file:///"], length: 1048576}
children:
  - name: data/one
"""
JOURNAL = "data/one"


@pytest.fixture
async def broker(etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path
                 ) -> AsyncIterator[BrokerServer]:
    async with started_broker(etcd_server, etcd_prefix, tmp_path, SPECS,
                              data_port=0) as server:
        yield server


def data_port(server: BrokerServer) -> int:
    assert server.framed is not None
    return server.framed.port


async def read_all(client: JournalClient, end: int) -> bytes:
    out = bytearray()
    async for chunk in client.read(JOURNAL, 0, end_offset=end):
        out += chunk.content
    return bytes(out)


async def raw(server: BrokerServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", data_port(server))


async def frame(reader: asyncio.StreamReader) -> tuple[Kind, bytes]:
    kind, length, _ = frames.parse_header(await reader.readexactly(frames.HEADER.size),
                                          1 << 30)
    return kind, await reader.readexactly(length)


async def test_the_member_spec_advertises_the_data_endpoint(broker: BrokerServer) -> None:
    assert broker.member is not None
    assert broker.member.data_endpoint == f"tcp://127.0.0.1:{data_port(broker)}"
    _, kv = await broker.etcd.get(broker.layout.member_key(broker.id.zone, broker.id.suffix))
    assert kv is not None
    assert decode_broker(kv.value).data_endpoint == broker.member.data_endpoint


async def test_appends_take_the_data_path_pipelined_and_in_order(broker: BrokerServer
                                                                 ) -> None:
    async with JournalClient(broker.grpc_address) as client:
        first = await client.append(JOURNAL, b"by grpc\n")  # (learns the endpoint)
        assert first.commit.sha1 != NO_SHA1
        lines = [f"line {i}\n".encode() for i in range(200)]
        offsets, at = [], first.commit.end
        for line in lines:
            offsets.append(at)
            at += len(line)
        results = await asyncio.gather(*(client.append(JOURNAL, line, offset=offset)
                                         for line, offset in zip(lines, offsets, strict=True)))
        assert [r.commit.begin for r in results] == offsets
        assert all(r.commit.sha1 == NO_SHA1 for r in results)  # (made on the data path)
        assert await read_all(client, at) == b"by grpc\n" + b"".join(lines)
        with pytest.raises(BrokerError, match="WRONG_APPEND_OFFSET"):
            await client.append(JOURNAL, b"late\n", offset=first.commit.end)
        assert await client.write_head(JOURNAL) == at


async def test_a_corrupt_append_is_refused_and_the_connection_serves_on(
        broker: BrokerServer) -> None:
    reader, writer = await raw(broker)
    try:
        writer.write(frames.hello(""))
        assert (await frame(reader))[0] is Kind.READY
        bad = bytearray(append_frame(JOURNAL, b"corrupt\n"))
        bad[-1] ^= 0xFF
        writer.write(bytes(bad) + append_frame(JOURNAL, b"fine\n")
                     + append_frame("no/such", b"x\n"))
        kind, body = await frame(reader)
        assert kind is Kind.FAILED
        code, detail = frames.parse_refusal(body)
        assert code == 15 and "CRC-32" in detail  # DATA_LOSS
        kind, body = await frame(reader)
        assert kind is Kind.APPENDED
        response = frames.parse_appended(body)
        assert response.status == pb.OK and response.commit.end - response.commit.begin == 5
        kind, body = await frame(reader)
        assert kind is Kind.APPENDED
        assert frames.parse_appended(body).status == pb.JOURNAL_NOT_FOUND
    finally:
        writer.close()
    async with JournalClient(broker.grpc_address) as client:
        assert await read_all(client, await client.write_head(JOURNAL)) == b"fine\n"


@pytest.mark.parametrize(("send", "why"), [
    (b"GET / HTTP/1.1\r\n\r\n", "not a data-path client"),
    (frames.PREFACE + frames.HEADER.pack(1 << 30, Kind.HELLO, 0), "over the"),
    (frames.PREFACE + frames.header(Kind.APPEND, 0), "expected HELLO"),
])
async def test_hostile_openings_get_goaway(broker: BrokerServer, send: bytes, why: str
                                           ) -> None:
    reader, writer = await raw(broker)
    try:
        writer.write(send)
        kind, body = await frame(reader)
        assert kind is Kind.GOAWAY and why in frames.parse_refusal(body)[1]
        assert await reader.read() == b""  # closed
    finally:
        writer.close()
    async with JournalClient(broker.grpc_address) as client:  # serving on
        await client.append(JOURNAL, b"still\n")


@pytest.mark.parametrize(("tail", "why"), [
    (frames.header(Kind.READY, 0) + append_frame(JOURNAL, b"never\n"), "not READY"),
    # Found writing the data path's hostile-input cases: a connection that ended inside
    # a frame cancelled the complete appends before it, unanswered.
    (append_frame(JOURNAL, b"never\n")[:-3], "inside a frame"),
])
async def test_a_bad_frame_ends_the_connection_after_the_appends_before_it(
        broker: BrokerServer, tail: bytes, why: str) -> None:
    """A malformed frame, or the connection's end inside one (the client half-closes):
    the complete appends before it are served and answered, then GOAWAY."""
    reader, writer = await raw(broker)
    try:
        writer.write(frames.hello("") + append_frame(JOURNAL, b"kept\n") + tail)
        writer.write_eof()
        assert (await frame(reader))[0] is Kind.READY
        kind, body = await frame(reader)
        assert kind is Kind.APPENDED and frames.parse_appended(body).status == pb.OK
        kind, body = await frame(reader)
        assert kind is Kind.GOAWAY and why in frames.parse_refusal(body)[1]
        assert await reader.read() == b""
    finally:
        writer.close()
    async with JournalClient(broker.grpc_address) as client:
        assert await read_all(client, await client.write_head(JOURNAL)) == b"kept\n"


async def test_a_huge_length_is_refused_without_reading_it(broker: BrokerServer) -> None:
    reader, writer = await raw(broker)
    try:
        writer.write(frames.hello("") + frames.HEADER.pack(0xFFFFFFFF, Kind.APPEND, 0))
        assert (await frame(reader))[0] is Kind.READY
        kind, body = await frame(reader)
        assert kind is Kind.GOAWAY and "limit" in frames.parse_refusal(body)[1]
    finally:
        writer.close()


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_lying_lengths_hold_what_was_sent_and_stalled_frames_are_cut(
        broker: BrokerServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found writing the data path's hostile-input cases: a frame's body buffer was
    allocated at the length its header claimed, so 100 connections each claiming
    16 MiB and sending 10 bytes held 1.6 GiB, and kept it for as long as they stayed
    silent. The buffer takes the claimed length only once `BODY_START` bytes arrived,
    and a frame begun that sends no byte for `FRAME_STALL_SECONDS` ends its connection
    (GOAWAY, DEADLINE_EXCEEDED)."""
    monkeypatch.setattr(framed, "FRAME_STALL_SECONDS", 2.0)
    lie = frames.HEADER.pack(frames.DEFAULT_MAX_BODY, Kind.APPEND, 0) + b"0123456789"
    before = _rss_mib()
    conns = [await raw(broker) for _ in range(100)]
    try:
        for _, writer in conns:
            writer.write(frames.hello("") + lie)
        for reader, _ in conns:
            assert (await frame(reader))[0] is Kind.READY
        await asyncio.sleep(0.5)  # (all of them claimed, and wait mid-frame)
        assert _rss_mib() - before < 100, "lying lengths were allocated"
        for reader, _ in conns:
            kind, body = await asyncio.wait_for(frame(reader), 10)
            code, detail = frames.parse_refusal(body)
            assert kind is Kind.GOAWAY and code == 4 and "no byte" in detail  # DEADLINE
            assert await reader.read() == b""
    finally:
        for _, writer in conns:
            writer.close()
    async with JournalClient(broker.grpc_address) as client:  # serving on
        await client.append(JOURNAL, b"first\n")  # (learns the data endpoint)
        big = bytes(range(256)) * 8192  # 2 MiB: past the first buffer
        result = await client.append(JOURNAL, big)
        assert result.commit.sha1 == NO_SHA1  # (made on the data path)
        assert (await read_all(client, result.commit.end))[-len(big):] == big


async def test_an_unreachable_data_endpoint_falls_back_to_grpc(broker: BrokerServer) -> None:
    assert broker.framed is not None
    await broker.framed.stop(0.1)  # (the member spec still names it)
    async with JournalClient(broker.grpc_address) as client:
        await client.append(JOURNAL, b"one\n")
        result = await client.append(JOURNAL, b"two\n")
        assert result.commit.sha1 == hashlib.sha1(b"two\n").digest()
        assert await read_all(client, result.commit.end) == b"one\ntwo\n"


async def test_tokens_and_tls_as_on_grpc(etcd_server: EmbeddedEtcd, etcd_prefix: str,
                                         tmp_path: Path) -> None:
    sec = ClusterSecurity.make(tmp_path / "pki")
    config = {k: v for k, v in sec.config().items() if not k.startswith("etcd_")}
    async with started_broker(etcd_server, etcd_prefix, tmp_path, data_port=0,
                              **config) as server:
        admin = token(sec.key, *Capability)
        async with JournalClient(f"https://127.0.0.1:{server.grpc_port}",
                                 auth=sec.pki.client(sec.cert, admin)) as client:
            await client.apply(journal_changes_from_yaml(SPECS))
            await server.wait_routed({JOURNAL})
            assert server.member is not None and \
                server.member.data_endpoint.startswith("tls://")
            first = await client.append(JOURNAL, b"a\n")
            second = await client.append(JOURNAL, b"b\n")
            assert second.commit.sha1 == NO_SHA1  # by the data path, over TLS
            assert await read_all(client, second.commit.end) == b"a\nb\n"
            assert first.commit.end == second.commit.begin
        tls = sec.pki.client(sec.cert).tls
        assert tls is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", data_port(server),
                                                       ssl=tls.client_context())
        try:
            readonly = token(sec.key, Capability.READ)
            writer.write(frames.hello(readonly))
            kind, body = await frame(reader)
            assert kind is Kind.GOAWAY
            assert frames.parse_refusal(body)[0] == 7  # PERMISSION_DENIED
        finally:
            writer.close()


def test_crc_is_zlibs() -> None:  # (what a client in another language computes)
    assert frames.parse_append(append_frame("a/b", b"123456789")[frames.HEADER.size:]).crc \
        == zlib.crc32(b"123456789") == 0xCBF43926


async def test_a_free_port_on_every_address_is_one_port(etcd_server: EmbeddedEtcd,
                                                        etcd_prefix: str, tmp_path: Path
                                                        ) -> None:
    """(A bug: bound to every address with port 0, each address family got a port of its
    own, and the advertised one was sometimes the IPv6 socket's: IPv4 clients were
    refused and appended by gRPC.)"""
    async with started_broker(etcd_server, etcd_prefix, tmp_path, SPECS, bind="",
                              data_port=0) as server:
        assert server.framed is not None
        assert {port for _, port in server.framed.listening} == {server.framed.port}
        async with JournalClient(server.grpc_address) as client:
            await client.append(JOURNAL, b"a\n")
            assert (await client.append(JOURNAL, b"b\n")).commit.sha1 == NO_SHA1


async def test_a_chained_append_commits_only_after_one_that_did(broker: BrokerServer
                                                                ) -> None:
    reader, writer = await raw(broker)
    try:
        writer.write(frames.hello("") + append_frame(JOURNAL, b"one\n")
                     + append_frame(JOURNAL, b"two\n", chained=True)
                     + append_frame(JOURNAL, b"bad\n", offset=1, chained=True)  # refused
                     + append_frame(JOURNAL, b"three\n", chained=True)
                     + append_frame(JOURNAL, b"four\n", chained=True)
                     + append_frame(JOURNAL, b"five\n"))  # (not chained: served)
        assert (await frame(reader))[0] is Kind.READY
        answers = [await frame(reader) for _ in range(6)]
        kinds = [k for k, _ in answers]
        assert kinds == [Kind.APPENDED, Kind.APPENDED, Kind.APPENDED, Kind.FAILED,
                         Kind.FAILED, Kind.APPENDED]
        assert frames.parse_appended(answers[2][1]).status == pb.WRONG_APPEND_OFFSET
        for _, body in answers[3:5]:
            code, detail = frames.parse_refusal(body)
            assert code == 10 and "did not commit" in detail  # ABORTED
    finally:
        writer.close()
    async with JournalClient(broker.grpc_address) as client:
        assert await read_all(client, await client.write_head(JOURNAL)) == \
            b"one\ntwo\nfive\n"


async def test_an_append_queue_pipelines_in_order_through_a_refusal(
        etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path) -> None:
    """Batches in flight at once on the data path; one the broker refuses (too large)
    fails alone: those chained after it are sent again, and all commit in call order."""
    async with started_broker(etcd_server, etcd_prefix, tmp_path, SPECS, data_port=0,
                              max_append_size=64 << 10) as server, \
            JournalClient(server.grpc_address) as client, \
            AppendQueue(client, max_batch_bytes=16 << 10) as queue:
        for warm in (b"w1\n", b"w2\n"):  # (the route, then the data path's connection)
            await queue.append(JOURNAL, warm)
        assert client.data_path(JOURNAL) is not None
        lines = [f"{i:05d} ".encode() * 160 + b"\n" for i in range(60)]  # ~1 KiB
        futures = [queue.append(JOURNAL, line) for line in lines[:30]]
        too_large = queue.append(JOURNAL, b"x" * (100 << 10))
        futures += [queue.append(JOURNAL, line) for line in lines[30:]]
        results = await asyncio.gather(*futures)
        with pytest.raises(BrokerError, match="APPEND_TOO_LARGE"):
            await too_large
        assert all(r.commit.sha1 == NO_SHA1 for r in results)
        end = await client.write_head(JOURNAL)
        assert await read_all(client, end) == b"w1\nw2\n" + b"".join(lines)


async def test_stopping_answers_every_append_it_read(broker: BrokerServer) -> None:
    """The data path stops reading, answers what it read, then closes: every append
    answered is written, none unanswered is."""
    reader, writer = await raw(broker)
    try:
        writer.write(frames.hello("") + b"".join(
            append_frame(JOURNAL, f"{i:04d}\n".encode()) for i in range(200)))
        assert (await frame(reader))[0] is Kind.READY
        assert (await frame(reader))[0] is Kind.APPENDED  # (under way)
        assert broker.framed is not None
        stopping = asyncio.create_task(broker.framed.stop(5.0))
        answered = 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                kind, body = await frame(reader)
                assert kind is Kind.APPENDED and frames.parse_appended(body).status == pb.OK
                answered += 1
        await stopping
    finally:
        writer.close()
    async with JournalClient(broker.grpc_address, data_path=False) as client:
        written = await read_all(client, await client.write_head(JOURNAL))
    assert written == b"".join(f"{i:04d}\n".encode() for i in range(answered))


async def test_appends_with_offsets_out_of_order_on_one_connection(broker: BrokerServer
                                                                   ) -> None:
    reader, writer = await raw(broker)
    try:
        writer.write(frames.hello("") + append_frame(JOURNAL, b"first\n", offset=0)
                     + append_frame(JOURNAL, b"third\n", offset=12)
                     + append_frame(JOURNAL, b"secnd\n", offset=6))
        assert (await frame(reader))[0] is Kind.READY
        begins = []
        for _ in range(3):
            kind, body = await frame(reader)
            assert kind is Kind.APPENDED
            response = frames.parse_appended(body)
            assert response.status == pb.OK
            begins.append(response.commit.begin)
        assert begins == [0, 12, 6]  # (answered in the order sent)
    finally:
        writer.close()
    async with JournalClient(broker.grpc_address) as client:
        assert await read_all(client, 18) == b"first\nsecnd\nthird\n"


async def test_a_client_sending_past_a_goaway_still_reads_it(broker: BrokerServer) -> None:
    """The broker closes a connection it refused only after the client stopped sending
    (or a bound): closing with unread bytes would reset the connection, and the client
    could lose the GOAWAY that says why, and the answers before it."""
    reader, writer = await raw(broker)
    try:
        writer.write(frames.hello("") + append_frame(JOURNAL, b"kept\n")
                     + frames.header(Kind.READY, 0))  # a client sends no READY
        assert (await frame(reader))[0] is Kind.READY
        assert (await frame(reader))[0] is Kind.APPENDED
        sent = 0
        with contextlib.suppress(ConnectionError):
            for _ in range(64):  # 4 MiB more, after the GOAWAY was sent
                writer.write(b"\0" * (64 << 10))
                await writer.drain()
                sent += 64 << 10
        kind, body = await frame(reader)
        assert kind is Kind.GOAWAY and "APPEND, not READY" in frames.parse_refusal(body)[1]
        assert sent == 4 << 20  # (all of it read and dropped, none refused by a reset)
        assert await reader.read() == b""  # then closed, not reset
    finally:
        writer.close()
