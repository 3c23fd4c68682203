"""Publish, then read committed: the whole message path over in-memory journals.

Publishers write committed and transactional messages through `MemoryJournals`; some
appends are re-sent, and a producer fails mid-transaction and re-writes its last ACK
intents (rolling the transaction back). Each journal's bytes are then read back in random
chunks through the real ndjson framing, `read_uncommitted` and `read_committed` with a
small Sequencer ring: the output is exactly the committed messages, each once, in each
producer's order.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import AsyncIterator

from hypothesis import given, settings
from hypothesis import strategies as st

import gazette.message.framing  # noqa: F401 - registers the framings
from gazette.labels import Selector
from gazette.local.tutorial import FOOBAR_TREE_YAML
from gazette.message.base import Envelope, framing_for
from gazette.message.mapping import StaticPartitions, modulo_mapping
from gazette.message.publisher import MemoryJournals, Publisher
from gazette.message.reader import read_committed, read_uncommitted
from gazette.message.sequencer import Sequencer
from gazette.message.types import JsonMessage
from gazette.protocol.trees import journal_changes_from_yaml

SPECS = [c.spec for c in journal_changes_from_yaml(FOOBAR_TREE_YAML) if c.spec]
NDJSON = "application/x-ndjson"


async def chunks_of(data: bytes, rng: random.Random) -> AsyncIterator[bytes]:
    i = 0
    while i < len(data):
        n = rng.randint(1, 300)
        yield data[i:i + n]
        i += n


async def publish(journals: MemoryJournals, seed: int) -> list[str]:
    """Publish a random workload; returns the ids of messages that commit."""
    rng = random.Random(seed)
    partitions = StaticPartitions(SPECS, Selector.parse("prefix=foobar/"))
    mapping = modulo_mapping(lambda m: m["key"].encode(), partitions)
    committed: list[str] = []
    for p in range(3):
        pub = Publisher(journals)
        intents = []  # the last committed ACK intents, as a consumer checkpoints them
        for t in range(rng.randint(1, 6)):
            ids = [f"p{p}-t{t}-m{i}" for i in range(rng.randint(1, 5))]
            kind = rng.choice(["committed", "txn", "txn", "rollback"])
            for mid in ids:
                msg = JsonMessage(id=mid, key=f"k{rng.randint(0, 9)}", body="x" * 50)
                if kind == "committed":
                    fut = pub.publish_committed(mapping, msg)
                else:
                    fut = pub.publish_uncommitted(mapping, msg)
                if rng.random() < 0.2:  # the append is re-sent: its bytes appear twice
                    commit = await fut
                    journals.append(commit.journal, journals.read(commit.journal,
                                                                  commit.begin, commit.end))
            if kind == "committed":
                committed.extend(ids)
            elif kind == "txn":
                intents = pub.build_ack_intents()
                for intent in intents:
                    journals.append(intent.journal, intent.data)
                committed.extend(ids)
            else:
                # The producer fails before committing. Recovering, it re-writes its
                # checkpointed ACK intents, which roll the open transaction back in those
                # journals, and goes on as a new producer (in journals without an intent,
                # the abandoned messages stay pending: never committed).
                for intent in intents:
                    journals.append(intent.journal, intent.data)
                pub, intents = Publisher(journals), []
    return committed


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 8))
async def test_published_messages_read_committed_exactly_once(seed: int, ring: int) -> None:
    journals = MemoryJournals()
    committed = await publish(journals, seed)
    rng = random.Random(seed + 1)
    seq = Sequencer(buffer=ring)
    framing = framing_for(NDJSON)

    async def replay(journal: str, begin: int, end: int) -> AsyncIterator[list[Envelope]]:
        async for batch in read_uncommitted(journal, chunks_of(
                journals.read(journal, begin, end), rng), framing_for(NDJSON), begin):
            yield batch

    out: list[str] = []
    for journal in journals.journals:
        source = read_uncommitted(journal, chunks_of(journals.read(journal), rng), framing)
        async for batch in read_committed(source, seq, replay):
            out.extend(env.message["id"] for env in batch)

    assert len(out) == len(set(out)), "a message was delivered twice"
    assert sorted(out) == sorted(committed)
    # Each producer's messages in each journal come in publish order.
    assert all(out.index(a) < out.index(b) for a, b in itertools.pairwise(committed)
               if a.split("-")[0] == b.split("-")[0] and a in out and b in out
               and _journal_of(journals, a) == _journal_of(journals, b))


def _journal_of(journals: MemoryJournals, mid: str) -> str:
    return next(j for j in journals.journals if f'"id":"{mid}"'.encode() in journals.read(j))
