"""The message library's figures (issue: exactly-once messages).

- ``ndjson_decode_msgs_per_s`` / ``ndjson_encode_msgs_per_s``: 1 KiB JSON messages through
  the ndjson framing (decode from 1 MiB reads, with frame offsets; encode in batches of
  1000), next to msgspec's own batch calls as the ceiling;
- ``sequencer_msgs_per_s``: the same messages, from 4 producers in transactions of 10
  messages plus an ACK, queued and dequeued through a Sequencer;
- ``read_committed_msgs_per_s``: decode and sequence together (`read_uncommitted` into
  `read_committed` over 1 MiB chunks), what a consumer's read path costs.

Prints one JSON object as its last line.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import time
from collections.abc import AsyncIterator

import uvloop
from message_codec import (  # type: ignore[import-not-found]
    measure_ceilings,
    measure_ndjson_decode,
    measure_ndjson_encode,
)

import gazette.message.framing  # noqa: F401 - registers framings
from gazette.message import (
    Envelope,
    JsonMessage,
    Sequencer,
    framing_for,
    read_committed,
    read_uncommitted,
)
from gazette.message import uuid as mu

N_TXNS, PER_TXN, PRODUCERS = 10_000, 10, 4
CHUNK = 1 << 20
RUNS = 3


def journal_bytes() -> tuple[bytes, int]:
    """An ndjson journal of transactions from 4 producers; returns (bytes, messages)."""
    framing = framing_for("application/x-ndjson")
    clocks = [mu.Clock(mu.Clock.from_unix(1.7e9 + p)) for p in range(PRODUCERS)]
    body = "x" * 900
    parts, n = [], 0
    for t in range(N_TXNS):
        p = t % PRODUCERS
        batch = []
        for i in range(PER_TXN):
            msg = JsonMessage(user=f"u{t}", seq=i, body=body)
            msg.set_uuid(mu.build(p + 1, clocks[p].tick(), mu.Flags.CONTINUE_TXN))
            batch.append(msg)
        ack = JsonMessage()
        ack.set_uuid(mu.build(p + 1, clocks[p].tick(), mu.Flags.ACK_TXN))
        batch.append(ack)
        parts.append(framing.encode(batch))
        n += PER_TXN
    return b"".join(parts), n


def median_rate(n: int, runs: list[float]) -> float:
    return round(n / statistics.median(runs))


def measure_sequencer(envs: list[Envelope], committed: int) -> float:
    times = []
    for _ in range(RUNS):
        seq = Sequencer(buffer=8192)
        start = time.perf_counter()
        out = 0
        for i in range(0, len(envs), 1000):
            seq.queue_all(envs[i:i + 1000])
            out += len(seq.drain())
        times.append(time.perf_counter() - start)
        assert out == committed, (out, committed)
    return median_rate(committed, times)


async def measure_read_committed(data: bytes, committed: int) -> float:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(data), CHUNK):
            yield data[i:i + CHUNK]

    async def no_replay(journal: str, begin: int, end: int) -> AsyncIterator[list[Envelope]]:
        raise AssertionError("the ring is large enough: no replay expected")
        yield []

    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        out = 0
        source = read_uncommitted("bench/journal", chunks(), framing_for("application/x-ndjson"))
        async for batch in read_committed(source, Sequencer(buffer=8192), no_replay):
            out += len(batch)
        times.append(time.perf_counter() - start)
        assert out == committed, (out, committed)
    return median_rate(committed, times)


async def decoded(data: bytes) -> list[Envelope]:
    async def one() -> AsyncIterator[bytes]:
        yield data

    return [e async for b in read_uncommitted("bench/journal", one(),
                                              framing_for("application/x-ndjson"))
            for e in b]


def main() -> None:
    figures: dict[str, float] = {
        "ndjson_decode_msgs_per_s": round(measure_ndjson_decode()),
        "ndjson_encode_msgs_per_s": round(measure_ndjson_encode()),
    }
    data, committed = journal_bytes()
    envs = uvloop.run(decoded(data))
    figures["sequencer_msgs_per_s"] = measure_sequencer(envs, committed)
    # The 110,000 decoded messages are garbage now: left alive, every full collection
    # during the next measurement would scan them, which no consumer's reader pays.
    del envs
    gc.collect()
    figures["read_committed_msgs_per_s"] = uvloop.run(measure_read_committed(data, committed))
    figures.update({k: round(v) for k, v in measure_ceilings().items()})
    figures["message_bytes"] = round(len(data) / (committed * 1.1))
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
