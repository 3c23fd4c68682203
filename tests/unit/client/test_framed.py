"""A client's data path against the frames a broker answers with: which failures leave
an append in doubt (never sent again without an offset) and which are refusals. The
broker here is a few lines speaking the protocol (`gazette.protocol.frames`) and
answering every APPEND with one chosen frame; the real broker's data path is tested in
tests/integration/broker/test_data_path.py and by the fault suites with
``GAZETTE_TEST_DATA_PATH=1``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from gazette.client import AppendUncertain, BrokerError, JournalClient, RetryPolicy
from gazette.client.appends import ChainBroken
from gazette.client.framed import FramedConnection
from gazette.pb import broker_pb2 as pb
from gazette.protocol import frames
from gazette.protocol.frames import Kind

JOURNAL = "a/journal"


class Answering:
    """A data-path server answering each APPEND with `answer`, counting them."""

    def __init__(self, answer: bytes) -> None:
        self.answer, self.appends = answer, 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                    ) -> None:
        await reader.readexactly(len(frames.PREFACE))
        _, length, _ = frames.parse_header(await reader.readexactly(frames.HEADER.size),
                                           frames.MAX_META)
        await reader.readexactly(length)
        writer.write(frames.ready(1 << 20))
        try:
            while True:
                kind, length, _ = frames.parse_header(
                    await reader.readexactly(frames.HEADER.size), 1 << 20)
                await reader.readexactly(length)
                assert kind is Kind.APPEND
                self.appends += 1
                writer.write(self.answer)
        except asyncio.IncompleteReadError:
            writer.close()


@pytest.fixture
async def client() -> AsyncIterator[tuple[JournalClient, list[Answering]]]:
    servers: list[Answering] = []
    async with JournalClient("127.0.0.1:1", retry=RetryPolicy(attempts=2)) as c:
        yield c, servers


async def serving(client: JournalClient, answer: bytes) -> tuple[Answering, asyncio.Server]:
    answering = Answering(answer)
    server = await asyncio.start_server(answering.serve, "127.0.0.1", 0)
    routed(client, server)
    return answering, server


def routed(client: JournalClient, server: asyncio.Server) -> None:
    """The journal's primary's data endpoint, as a response's route would name it."""
    port = server.sockets[0].getsockname()[1]
    client._appends._data_targets[JOURNAL] = f"tcp://127.0.0.1:{port}"


async def connected(client: JournalClient) -> FramedConnection:
    data = client._appends._data
    assert data is not None
    conn = await data.get(client._appends._data_targets[JOURNAL])
    assert conn is not None and client.data_path(JOURNAL) is conn
    return conn


def failed(code: grpc.StatusCode, detail: str) -> bytes:
    return frames.refusal(Kind.FAILED, code.value[0], detail)


async def test_a_retryable_failure_is_in_doubt_and_not_sent_again(client) -> None:  # type: ignore[no-untyped-def]
    """(A bug: a FAILED UNAVAILABLE, the broker's AppendUncertain, was taken for a
    refusal and sent again: the fault suite found the message twice.)"""
    c, _ = client
    answering, server = await serving(c, failed(grpc.StatusCode.UNAVAILABLE,
                                                "replication failed after its proposal"))
    async with server:
        with pytest.raises(AppendUncertain):
            await c.append(JOURNAL, b"once\n")
        assert answering.appends == 1
        routed(c, server)  # (a failed attempt forgets it until a response names it)
        conn = await connected(c)
        with pytest.raises(AppendUncertain):
            await c.append_chained(conn, JOURNAL, [b"once\n"], chained=False)
        assert answering.appends == 2


async def test_a_broken_chain_and_a_refusal_wrote_nothing(client) -> None:  # type: ignore[no-untyped-def]
    c, _ = client
    answering, server = await serving(c, failed(grpc.StatusCode.ABORTED, "before it"))
    async with server:
        conn = await connected(c)
        with pytest.raises(ChainBroken):
            await c.append_chained(conn, JOURNAL, [b"x\n"], chained=True)
        answering.answer = frames.appended(pb.AppendResponse(
            status=pb.NOT_JOURNAL_PRIMARY_BROKER))
        with pytest.raises(BrokerError, match="NOT_JOURNAL_PRIMARY_BROKER"):
            await c.append_chained(conn, JOURNAL, [b"x\n"], chained=False)
        assert answering.appends == 2
