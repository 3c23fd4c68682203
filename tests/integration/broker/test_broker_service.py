"""The Journal gRPC service (Append, Read) on a real grpc.aio server over loopback."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gazette.labels import Selector
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import JournalSpec, selector_to_pb
from gazette_broker import JournalService, add_journal_service, replica
from gazette_broker.replica import Replica
from gazette_broker.routing import JournalRouting
from tests.fixtures.broker import plain_server

pytestmark = pytest.mark.integration

JOURNAL = "example/journal"


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[broker_pb2_grpc.JournalStub]:
    replica = Replica(JournalSpec(JOURNAL, replication=1), tmp_path)
    server = plain_server()
    add_journal_service(JournalService(JournalRouting({JOURNAL: replica})), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield broker_pb2_grpc.JournalStub(channel)
    finally:
        await channel.close()
        await server.stop(grace=None)


def append_requests(journal: str, *parts: bytes, commit: bool = True,
                    **meta: object) -> list[pb.AppendRequest]:
    reqs = [pb.AppendRequest(journal=journal, **meta)]  # type: ignore[arg-type]
    reqs += [pb.AppendRequest(content=p) for p in parts]
    if commit:
        reqs.append(pb.AppendRequest())
    return reqs


async def read_all(stub: broker_pb2_grpc.JournalStub, offset: int) -> bytes:
    return b"".join([r.content async for r in stub.Read(
        pb.ReadRequest(journal=JOURNAL, offset=offset))])


async def test_the_tutorials_append_and_reads(stub: broker_pb2_grpc.JournalStub) -> None:
    content = b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'
    resp = await stub.Append(iter(append_requests(JOURNAL, content[:30], content[30:])))
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (0, len(content))
    assert resp.commit.sha1 == hashlib.sha1(content).digest()
    assert await read_all(stub, 0) == content
    assert await read_all(stub, 16) == content[16:]  # 'Gazette!"}' and the next line


async def test_concurrent_appends_over_grpc_do_not_interleave(
    stub: broker_pb2_grpc.JournalStub,
) -> None:
    lines = [b'{"Msg": "Race!", "N": %d}\n' % i for i in range(20)]
    resps = await asyncio.gather(*(stub.Append(iter(append_requests(
        JOURNAL, line[:7], line[7:]))) for line in lines))
    assert all(r.status == pb.OK for r in resps)
    assert sorted((await read_all(stub, 0)).splitlines(keepends=True)) == sorted(lines)


async def test_refusals_and_bad_input(stub: broker_pb2_grpc.JournalStub) -> None:
    await stub.Append(iter(append_requests(JOURNAL, b"abc")))
    wrong = await stub.Append(iter(append_requests(JOURNAL, b"x", offset=1)))
    assert wrong.status == pb.WRONG_APPEND_OFFSET
    fenced = await stub.Append(iter(append_requests(
        JOURNAL, b"x", check_registers=selector_to_pb(Selector.parse("owner=me")))))
    assert fenced.status == pb.REGISTER_MISMATCH
    unknown = await stub.Append(iter(append_requests("no/such-journal", b"x")))
    assert unknown.status == pb.JOURNAL_NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Append(iter(append_requests("bad//name", b"x")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "journal" in (err.value.details() or "")
    # A stream that ends without its commit message appends nothing.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Append(iter(append_requests(JOURNAL, b"partial", commit=False)))
    assert err.value.code() == grpc.StatusCode.CANCELLED
    not_yet = [r async for r in stub.Read(pb.ReadRequest(journal=JOURNAL, offset=-1))]
    assert [(r.status, r.write_head) for r in not_yet] == [(pb.OFFSET_NOT_YET_AVAILABLE, 3)]
    assert await read_all(stub, 0) == b"abc"  # the broker kept serving, nothing leaked


async def test_a_blocking_read_streams_later_appends(stub: broker_pb2_grpc.JournalStub) -> None:
    await stub.Append(iter(append_requests(JOURNAL, b"old\n")))
    call = stub.Read(pb.ReadRequest(journal=JOURNAL, offset=-1, block=True))
    await stub.Append(iter(append_requests(JOURNAL, b"new\n")))
    first = await asyncio.wait_for(call.read(), 10)
    assert (first.offset, first.content) == (4, b"new\n")
    call.cancel()


async def test_append_whole_is_the_same_append_in_one_call(
    stub: broker_pb2_grpc.JournalStub, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (An offset ahead of the head waits this long for the head to get there.)
    monkeypatch.setattr(replica, "AHEAD_WAIT_SECONDS", 0.3)
    first = await stub.AppendWhole(pb.AppendRequest(journal=JOURNAL, content=b"one\n"))
    assert first.status == pb.OK and (first.commit.begin, first.commit.end) == (0, 4)
    assert first.commit.sha1 == hashlib.sha1(b"one\n").digest()
    # Its metadata works as an Append stream's first message does.
    fenced = await stub.AppendWhole(pb.AppendRequest(
        journal=JOURNAL, content=b"x", check_registers=selector_to_pb(Selector.parse("a=b"))))
    assert fenced.status == pb.REGISTER_MISMATCH
    wrong = await stub.AppendWhole(pb.AppendRequest(journal=JOURNAL, content=b"x", offset=9))
    assert wrong.status == pb.WRONG_APPEND_OFFSET
    at = await stub.AppendWhole(pb.AppendRequest(journal=JOURNAL, content=b"two\n", offset=4))
    assert at.status == pb.OK and at.commit.end == 8
    unknown = await stub.AppendWhole(pb.AppendRequest(journal="no/such", content=b"x"))
    assert unknown.status == pb.JOURNAL_NOT_FOUND
    for request, field in [(pb.AppendRequest(journal=JOURNAL), "content"),
                           (pb.AppendRequest(journal="bad//name", content=b"x"), "journal")]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.AppendWhole(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (err.value.details() or "")
    # Concurrent whole appends and streams never interleave.
    lines = [b'{"N": %d}\n' % i for i in range(20)]
    resps = await asyncio.gather(*(
        stub.AppendWhole(pb.AppendRequest(journal=JOURNAL, content=line)) if i % 2 else
        stub.Append(iter(append_requests(JOURNAL, line[:3], line[3:])))
        for i, line in enumerate(lines)))
    assert all(r.status == pb.OK for r in resps)
    content = await read_all(stub, 8)
    assert sorted(content.splitlines(keepends=True)) == sorted(lines)
    assert (await read_all(stub, 0))[:8] == b"one\ntwo\n"
