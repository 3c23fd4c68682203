"""The word-count example on two consumer members over a real broker and etcd: lines
are split into word deltas and counted by the shard that owns each word; the query API
(gRPC and HTTP) answers from any member, the other forwarding to the owner's primary;
bad queries are refused clearly; the member's /metrics and /healthz serve; a split
transaction abandoned by a failed read publishes its words once."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import Shard, ShardRunner
from gazette.consumer.member import ConsumerMember
from gazette.keyspace import Etcd
from gazette.message import Envelope, Publisher
from gazette.protocol import ShardSource, ShardSpec
from gazette_broker import BrokerServer
from gazette_consumer.examples import word_count
from gazette_consumer.examples.word_count import WordCount, count_shard, publish, query, setup
from tests.fixtures.abandoned import HELD_OPEN, flaky_reads, read_fails_mid_txn, run_through
from tests.fixtures.consumer import Stores, members_of, primaries
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.events import committed_lines
from tests.fixtures.polling import eventually
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration

LINES = ["the cat sat on the mat", "The dog ate the cat's dinner", "a cat, a dog; a bird"]
EXPECTED = {"the": 4, "cat": 2, "a": 3, "dog": 2, "cat's": 1, "bird": 1, "mat": 1}


@pytest.fixture
async def members(etcd_server: EtcdServer, consumer_root: str, broker_server: BrokerServer,
                  tmp_path: Path) -> AsyncIterator[list[ConsumerMember]]:
    etcd = Etcd(etcd_server.endpoint)
    await etcd.connect()
    try:
        async with JournalClient(broker_server.grpc_address) as client:
            await setup(client, etcd, etcd_root=consumer_root)
    finally:
        await etcd.close()
    started: list[ConsumerMember] = []
    try:
        started = await members_of(etcd_server, consumer_root, broker_server, Stores(),
                                   ["m0", "m1"], lambda: WordCount(tmp_path / "stores"),
                                   app_name="word-count")
        # Every shard has a running primary before a test queries one (a query for a
        # shard still starting is refused UNAVAILABLE, as it should be).
        shards = [spec.id for spec in word_count.shard_specs()]
        await eventually(lambda: len(primaries(started, shards)) == len(shards),
                         "every shard runs as primary", timeout=30)
        yield started
    finally:
        for m in started:
            await m.stop()


def address(member: ConsumerMember) -> str:
    return f"127.0.0.1:{member.port}"


async def test_words_are_counted_and_queried_from_any_member(
        members: list[ConsumerMember], broker_server: BrokerServer, tmp_path: Path) -> None:
    async with JournalClient(broker_server.grpc_address) as client:
        await publish(client, LINES)

    async def counted() -> bool:
        for word, n in EXPECTED.items():
            if (await query(address(members[0]), word))["count"] != n:
                return False
        return True

    await eventually(counted, "every word is counted", timeout=30)
    for member in members:  # each answers every word: the owner itself, or forwarded
        for word, n in EXPECTED.items():
            answer = await query(address(member), word.upper())
            assert answer == {"word": word, "count": n, "shard": count_shard(word)}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{member.http_url}/word-count/cat") as r:
                assert r.status == 200 and (await r.json())["count"] == 2
            async with http.get(f"{member.http_url}/word-count/%20%21") as r:
                assert r.status == 400 and "word" in (await r.json())["error"]
            async with http.get(f"{member.http_url}/healthz") as r:
                assert r.status == 200
            async with http.get(f"{member.http_url}/metrics") as r:
                metrics = await r.text()
            assert "gazette_consumer_messages_total" in metrics
            # Every line is counted: the split shard has nothing left to read.
            assert ('gazette_consumer_lag_bytes{journal="examples/word-count/lines",'
                    'shard="word-count/split"} 0.0') in metrics, metrics
    assert await query(address(members[1]), "unseen") == {
        "word": "unseen", "count": 0, "shard": count_shard("unseen")}
    # The counts are in the shards' JSON files.
    files = sorted(p.name for p in (tmp_path / "stores").iterdir())
    assert files == [f"word-count_{s}.json" for s in
                     ["count-000", "count-001", "count-002", "count-003", "split"]]


async def test_a_bad_query_is_refused_naming_the_field(
        members: list[ConsumerMember]) -> None:
    async with grpc.aio.insecure_channel(address(members[0])) as channel:
        call = channel.unary_unary(word_count.COUNT_PATH, request_serializer=None,
                                   response_deserializer=None)
        for bad, named in ((b"not json", "request"), (json.dumps({"word": 3}).encode(),
                                                      "word")):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(bad, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (err.value.details() or "").startswith(named)
    # The member keeps serving (query() itself asks again while a shard the allocator
    # is moving to the member that joined second answers UNAVAILABLE).
    assert (await query(address(members[0]), "cat", timeout=30))["word"] == "cat"


async def test_a_query_asks_again_while_the_shard_is_between_primaries() -> None:
    # The flake this caught: a query right after the members started met a shard being
    # handed to the second member ("has no running primary; retry") and failed.
    refusals = 2
    server = grpc.aio.server()

    async def count(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        nonlocal refusals
        if refusals:
            refusals -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no running primary; retry")
        return json.dumps({"word": json.loads(request)["word"], "count": 7}).encode()

    handler = grpc.method_handlers_generic_handler(word_count.SERVICE, {
        word_count.METHOD: grpc.unary_unary_rpc_method_handler(count)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        assert await query(f"127.0.0.1:{port}", "cat") == {"word": "cat", "count": 7}
        assert refusals == 0
        refusals = 1_000  # never served: the caller gets UNAVAILABLE at its deadline
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await query(f"127.0.0.1:{port}", "cat", timeout=0.5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)


async def test_setup_makes_the_journals_in_the_store_it_is_given(
        etcd_server: EtcdServer, consumer_root: str, broker_server: BrokerServer,
        s3_bucket: S3Bucket) -> None:
    # On the Helm chart the brokers serve s3:// stores only: setup takes the store.
    store = f"{s3_bucket.url}examples/"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette_consumer.examples.word_count",
        "--broker.address", broker_server.grpc_address, "--etcd.address",
        etcd_server.endpoint, "--etcd.prefix", consumer_root, "setup",
        "--fragment-store", store, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    async with JournalClient(broker_server.grpc_address) as client:
        listing = await client.list("prefix=examples/word-count/")
    assert {j.spec.name for j in listing.journals} == {
        word_count.LINES, *(f"{word_count.DELTAS}part-{i:03d}" for i in range(4))}
    assert {j.spec.fragment.stores for j in listing.journals} == {(store,)}


class Watched(WordCount):
    """Word count, counting the messages its transactions consumed."""

    consumed = 0

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        self.consumed += 1
        super().consume_message(shard, store, envelope, publisher)


async def test_a_split_abandoned_by_a_failed_read_publishes_its_words_once(
        etcd_server: EtcdServer, consumer_root: str, broker_server: BrokerServer) -> None:
    etcd = Etcd(etcd_server.endpoint)
    await etcd.connect()
    app = Watched()
    source = (ShardSource(word_count.LINES),)
    try:
        async with JournalClient(broker_server.grpc_address) as client, \
                flaky_reads(broker_server.grpc_address) as (relay, flaky), \
                AppendQueue(client) as out:
            await setup(client, etcd, etcd_root=consumer_root)
            await publish(client, LINES)
            await read_fails_mid_txn(
                ShardRunner(ShardSpec(word_count.SPLIT_SHARD, source, **HELD_OPEN), app,
                            flaky, out), relay, lambda: app.consumed == len(LINES))
            # The shard runs again here (as its member runs it after a transient failure).
            await run_through(ShardRunner(ShardSpec(word_count.SPLIT_SHARD, source), app,
                                          client, out), client, [word_count.LINES])
            counts: dict[str, int] = {}
            for i in range(word_count.PARTS):
                for delta in await committed_lines(client, f"{word_count.DELTAS}part-{i:03d}"):
                    counts[delta["word"]] = counts.get(delta["word"], 0) + delta["n"]
    finally:
        await etcd.close()
    assert counts == Counter(w for line in LINES for w in word_count.words(line))
