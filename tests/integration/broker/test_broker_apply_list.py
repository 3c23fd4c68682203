"""Journal service Apply and List (+watch) against a real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from gazette.keyspace import Etcd, KeySpace, Layout
from gazette.keyspace.specs import Decoder
from gazette.labels import Selector
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML, TUTORIAL_SELECTIONS
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import JournalSpec, journal_spec_to_pb, selector_to_pb
from gazette.protocol.trees import journal_changes_from_yaml
from gazette_broker import JournalService, add_journal_service
from gazette_broker.routing import JournalRouting
from tests.fixtures.broker import plain_server

pytestmark = pytest.mark.integration


@pytest.fixture
async def stub(etcd: Etcd, etcd_prefix: str) -> AsyncIterator[broker_pb2_grpc.JournalStub]:
    layout = Layout(etcd_prefix)
    keyspace: KeySpace[Any] = KeySpace(etcd, layout.root + "/", Decoder(layout))
    async with keyspace:
        server = plain_server()
        add_journal_service(JournalService(JournalRouting({}, etcd, keyspace, layout)), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            yield broker_pb2_grpc.JournalStub(channel)
        finally:
            await channel.close()
            await server.stop(grace=None)


def upserts(specs: list[JournalSpec], revision: int = 0) -> pb.ApplyRequest:
    return pb.ApplyRequest(changes=[
        pb.ApplyRequest.Change(expect_mod_revision=revision, upsert=journal_spec_to_pb(s))
        for s in specs])


async def listing(stub: broker_pb2_grpc.JournalStub, selector: str = "") -> pb.ListResponse:
    return await anext(aiter(stub.List(pb.ListRequest(
        selector=selector_to_pb(Selector.parse(selector))))))


TUTORIAL = [c.spec for c in journal_changes_from_yaml(TUTORIAL_JOURNALS_YAML) if c.spec]


async def test_apply_then_list_by_the_tutorials_selectors(
    stub: broker_pb2_grpc.JournalStub,
) -> None:
    resp = await stub.Apply(upserts(TUTORIAL))
    assert resp.status == pb.OK and resp.header.etcd.revision > 0
    for selector, selected in TUTORIAL_SELECTIONS:
        listed = await listing(stub, selector)
        assert tuple(j.spec.name for j in listed.journals) == selected, selector
        assert listed.header.etcd.revision >= resp.header.etcd.revision


async def test_a_stale_revision_is_refused_and_changes_nothing(
    stub: broker_pb2_grpc.JournalStub,
) -> None:
    spec = TUTORIAL[0]
    created = await stub.Apply(upserts([spec]))
    revision = created.header.etcd.revision
    edited = journal_spec_to_pb(spec)
    edited.fragment.compression_codec = pb.GZIP
    ok = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(
        expect_mod_revision=revision, upsert=edited)]))
    assert ok.status == pb.OK
    stale = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(
        expect_mod_revision=revision, upsert=journal_spec_to_pb(spec))]))
    assert stale.status == pb.ETCD_TRANSACTION_FAILED
    again = await stub.Apply(upserts([spec]))  # "create" of an existing journal
    assert again.status == pb.ETCD_TRANSACTION_FAILED
    [journal] = (await listing(stub, f"name={spec.name}")).journals
    assert journal.spec.fragment.compression_codec == pb.GZIP
    deleted = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(
        expect_mod_revision=journal.mod_revision, delete=spec.name)]))
    assert deleted.status == pb.OK


async def test_invalid_specs_are_rejected_naming_the_field(
    stub: broker_pb2_grpc.JournalStub,
) -> None:
    bad = journal_spec_to_pb(TUTORIAL[0])
    bad.replication = 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=bad)]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "changes[0].upsert.replication" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete="bad//x")]))
    assert "changes[0].delete" in (err.value.details() or "")
    assert (await listing(stub)).journals == []


async def test_a_watching_list_streams_later_changes(
    stub: broker_pb2_grpc.JournalStub,
) -> None:
    call = stub.List(pb.ListRequest(selector=selector_to_pb(Selector.parse("prefix=foobar/")),
                                    watch=True))
    first = await asyncio.wait_for(call.read(), 10)
    assert list(first.journals) == []
    await stub.Apply(upserts(TUTORIAL))
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        update = await asyncio.wait_for(call.read(), 10)
        names = [j.spec.name for j in update.journals]
        if names:
            break
        assert asyncio.get_running_loop().time() < deadline
    assert names == ["foobar/part-000", "foobar/part-001", "foobar/part-002"]
    call.cancel()


async def test_a_resumed_watch_waits_for_a_change_past_its_revision(
    stub: broker_pb2_grpc.JournalStub,
) -> None:
    await stub.Apply(upserts(TUTORIAL[:1]))
    seen = await listing(stub)
    call = stub.List(pb.ListRequest(watch=True,
                                    watch_resume_revision=seen.header.etcd.revision))
    # Nothing is sent for the revision the client already has...
    first = asyncio.ensure_future(call.read())
    done, _ = await asyncio.wait({first}, timeout=0.5)
    assert not done
    # ...until the journals change.
    applied = await stub.Apply(upserts(TUTORIAL[1:2]))
    update = await asyncio.wait_for(first, 10)
    assert update.header.etcd.revision >= applied.header.etcd.revision
    assert [j.spec.name for j in update.journals] == [s.name for s in TUTORIAL[:2]]
    call.cancel()

    # A resume revision behind the broker's state gets the current listing at once.
    call = stub.List(pb.ListRequest(watch=True, watch_resume_revision=1))
    assert len((await asyncio.wait_for(call.read(), 10)).journals) == 2
    call.cancel()
    call = stub.List(pb.ListRequest(watch=True, watch_resume_revision=-1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "watch_resume_revision" in (err.value.details() or "")
