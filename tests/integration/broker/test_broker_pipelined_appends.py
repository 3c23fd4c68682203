"""Appends at expected offsets, pipelined by one writer: one that reaches the broker
before the append it follows waits for the write head to get to its offset and lands
after it; one whose offset the head never reaches is refused WRONG_APPEND_OFFSET once
the wait is over; one behind the head is refused at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from gazette.client import BrokerError, JournalClient
from gazette.protocol import Status
from gazette_broker import BrokerServer, replica
from tests.fixtures.recoverylog import logs_client

pytestmark = pytest.mark.integration

SPECS = """
name: pipelined/
replication: 1
fragment: {stores: ['file:///'], compression_codec: NONE}
children:
  - name: pipelined/log
"""


@pytest.fixture
async def client(broker_server: BrokerServer) -> AsyncIterator[JournalClient]:
    async with logs_client(broker_server, SPECS) as c:
        yield c


async def test_an_append_ahead_of_the_head_lands_after_the_one_it_follows(
        client: JournalClient, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = "pipelined/log"
    await client.append(journal, b"first\n", offset=0)
    # The second append is sent first: it waits for the head to reach its offset.
    third = asyncio.ensure_future(client.append(journal, b"third\n", offset=12))
    await asyncio.sleep(0.05)
    assert not third.done()
    second = await client.append(journal, b"secnd\n", offset=6)
    assert (second.commit.begin, (await third).commit.begin) == (6, 12)
    content = b"".join([c.content async for c in client.read(journal, 0, end_offset=18)])
    assert content == b"first\nsecnd\nthird\n"

    monkeypatch.setattr(replica, "AHEAD_WAIT_SECONDS", 0.3)
    started = time.monotonic()
    with pytest.raises(BrokerError) as err:  # nothing ever lands at 100
        await client.append(journal, b"never\n", offset=100)
    assert err.value.status == Status.WRONG_APPEND_OFFSET
    assert 0.25 < time.monotonic() - started < 5
    started = time.monotonic()
    with pytest.raises(BrokerError) as err:  # behind the head: at once
        await client.append(journal, b"stale\n", offset=6)
    assert err.value.status == Status.WRONG_APPEND_OFFSET
    assert time.monotonic() - started < 0.25
    assert await client.write_head(journal) == 18
