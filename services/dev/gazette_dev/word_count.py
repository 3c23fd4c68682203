"""The consumer step of ``gazette dev up``: a member of the word-count example over the
local cluster, lines appended to its journal, and a word's count asked over HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from gazette.client import JournalClient
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.keyspace import Etcd
from gazette_consumer.examples.word_count import LINES, WordCount, publish, setup

TEXT = ["the quick brown fox jumps over the lazy dog",
        "the dog barks", "a fox, a dog, and the cat"]
WORD = "the"
#: How long the demo waits for the counts.
COUNT_SECONDS = 30.0


async def word_count(broker_address: str, etcd_address: str, data_dir: Path,
                     out: TextIO, port: int = 0, http_port: int = 0) -> ConsumerMember:
    """Start a word-count member, feed it, print a query's answer; returns the running
    member (stop it)."""
    etcd = Etcd(etcd_address)
    await etcd.connect()
    try:
        async with JournalClient(broker_address) as client:
            await setup(client, etcd)
    finally:
        await etcd.close()
    member = ConsumerMember(MemberConfig(
        "word-count", suffix="consumer-0", port=port, http_port=http_port,
        broker_address=broker_address, etcd_address=etcd_address, lease_ttl=5,
        drain_timeout=10), WordCount(data_dir / "word-count"))
    await member.start()
    print(f"\n$ gazette-consumer serve --app gazette_consumer.examples.word_count:WordCount"
          f"\n  consumer member {member.id} of word-count: gRPC {member.endpoint}, "
          f"HTTP {member.http_url}", file=out)
    async with JournalClient(broker_address) as client:
        head = await publish(client, TEXT)
    print(f"\n$ python -m gazette_consumer.examples.word_count publish  # {len(TEXT)} lines\n"
          f"{LINES} is at offset {head}", file=out)
    url = f"{member.http_url}/word-count/{WORD}"
    want = sum(line.split().count(WORD) for line in TEXT)
    answer: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http, asyncio.timeout(COUNT_SECONDS):
        while answer.get("count", 0) < want:  # the deltas pass through a second shard
            async with http.get(url) as r:
                answer = await r.json() if r.status == 200 else {}
            if answer.get("count", 0) < want:
                await asyncio.sleep(0.1)  # poll (bounded by COUNT_SECONDS)
    print(f"\n$ curl {url}\n{json.dumps(answer)}", file=out)
    return member
