"""Consumer transactions: exactly-once messages per second, and publish-to-commit latency.

Starts etcd and a broker (its own process), writes 1 KiB ndjson messages from 4
producers in transactions of 10 (each transaction's ACK appended after it), then runs
one shard of a count-by-key application over them:

- `eo_msgs_per_s_memory`: with `MemoryStore`;
- `eo_msgs_per_s_sql`: with `SQLStore` on a local PostgreSQL (each transaction's counts
  upserted in one statement, `unnest` of arrays, in `finalize_txn`);
- `read_committed_msgs_per_s`: the ceiling in the same run: the same bytes read and
  sequenced read-committed with no application and no commits;
- `e2e_p50_ms` / `e2e_p99_ms`: messages published committed at 1,000/s, from publish to
  the commit of the transaction that consumed them;
- `baseline_jetstream_msgs_per_s`: the baseline, in the same run with nothing of ours
  running: `nats-server -js` (file storage) holding the same messages (the same 1 KiB
  ndjson lines and keys, from 4 producers publishing asynchronously, at most
  `JS_WINDOW` unacknowledged each), counted by key by a nats-py pull consumer at least
  once: durable, fetching `JS_BATCH` at a time, decoding each with msgspec as ours does,
  and acknowledging each batch with one ack of its last message (ack policy "all"),
  which beat acking each message. Durability: by default JetStream's file store acks a
  publish before any fsync (it syncs in the background), and the counts live only in
  the consumer's memory (acked, so a crash loses them; ours commit them with the
  offsets, though this run's PostgreSQL has fsync off too);
- `sql_vs_jetstream`: `eo_msgs_per_s_sql` over the baseline (the target is >= 1).

Prints one JSON object last. Needs `nats-server` (`scripts/ensure-bench-deps.sh`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures

import msgspec
import nats
import uvloop
from bench_broker import serving_broker  # type: ignore[import-not-found]
from nats.js.api import AckPolicy, ConsumerConfig, PubAck, StorageType, StreamConfig

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import Application, MemoryStore, ShardRunner
from gazette.consumer.sql import SQLStore
from gazette.local import EmbeddedEtcd, free_port
from gazette.message import (
    JsonMessage,
    Partition,
    Publisher,
    Sequencer,
    drain,
    framing_for,
    read_uncommitted,
)
from gazette.message.uuid import Clock, Flags, build, new_producer_id
from gazette.protocol import ShardSource, ShardSpec
from tests.fixtures.postgres import create_database, start_pg_server

MESSAGES, PRODUCERS, TXN = 100_000, 4, 10
LATENCY_RATE, LATENCY_SECONDS = 1000, 5
NDJSON = "application/x-ndjson"
SPECS = """
name: bench/
replication: 1
labels: [{name: content-type, value: application/x-ndjson}]
fragment: {length: 268435456, compression_codec: NONE, stores: ["file:///"]}
children:
  - name: bench/input
  - name: bench/latency
"""
PAD = "x" * 960
# The baseline: unacknowledged async publishes per producer, messages per fetch.
JS_WINDOW, JS_BATCH = 1024, 1000
JS_STREAM, JS_SUBJECT = "BENCH", "bench.input"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def to(journal: str) -> Any:
    part = Partition(journal, NDJSON)
    return lambda msg: part


class CountByKey(Application):
    """Counts messages per key, written to the store in one statement per transaction."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def new_store(self, shard: Any) -> Any:
        return self.store

    def consume_message(self, shard: Any, store: Any, envelope: Any, publisher: Any) -> None:
        key = envelope.message["key"]
        shard.txn[key] = shard.txn.get(key, 0) + 1

    async def finalize_txn(self, shard: Any, store: Any, publisher: Any) -> None:
        txn = shard.txn
        if isinstance(store, SQLStore):
            # One statement per transaction, however many keys: each statement is a round
            # trip (a thousand awaited upserts cost a quarter of a second).
            await store.execute(
                "INSERT INTO counts (key, n) SELECT * FROM unnest(%s::text[], %s::bigint[]) "
                "ON CONFLICT (key) DO UPDATE SET n = counts.n + EXCLUDED.n",
                (list(txn), list(txn.values())))
        else:
            for key, n in txn.items():
                store.state[key] = store.state.get(key, 0) + n


async def produce(client: JournalClient) -> None:
    async with AppendQueue(client) as queue:
        publishers = [Publisher(queue) for _ in range(PRODUCERS)]
        sent = 0
        while sent < MESSAGES:
            for publisher in publishers:
                for _ in range(TXN):
                    publisher.publish_uncommitted(to("bench/input"), JsonMessage(
                        key=f"k{sent % 1000}", pad=PAD))
                    sent += 1
                for intent in publisher.build_ack_intents():
                    queue.append(intent.journal, intent.data)
            await queue.wait_for_room()
        await queue.flush()


async def read_committed_rate(client: JournalClient, head: int) -> float:
    framing, sequencer, count = framing_for(NDJSON), Sequencer(), 0

    async def chunks() -> Any:
        async for c in client.read("bench/input", 0, end_offset=head):
            yield c.content

    async def replay(journal: str, begin: int, end: int) -> Any:
        raise AssertionError("no replays expected")
        yield  # pragma: no cover

    started = time.perf_counter()
    async for batch in read_uncommitted("bench/input", chunks(), framing, 0):
        sequencer.queue_all(batch)
        count += len(await drain(sequencer, replay))
    assert count == MESSAGES, count
    return count / (time.perf_counter() - started)


async def consume(client: JournalClient, store: Any, head: int) -> tuple[float, int]:
    spec = ShardSpec("bench/shard", (ShardSource("bench/input"),))
    async with AppendQueue(client) as out:
        runner = ShardRunner(spec, CountByKey(store), client, out)
        started = time.perf_counter()
        task = asyncio.create_task(runner.run())
        try:
            await runner.shard.progress.wait_committed({"bench/input": head})
            elapsed = time.perf_counter() - started
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert runner.shard.progress.messages == MESSAGES, runner.shard.progress.messages
        return MESSAGES / elapsed, runner.shard.progress.transactions


class Latency(Application):
    """Records, for each message, publish time to its transaction's commit."""

    def __init__(self, expected: int) -> None:
        self.pending: list[float] = []
        self.samples: list[float] = []
        self.expected, self.done = expected, asyncio.Event()

    def consume_message(self, shard: Any, store: Any, envelope: Any, publisher: Any) -> None:
        self.pending.append(envelope.message["t"])

    def finished_txn(self, shard: Any, store: Any, committed: asyncio.Future[None]) -> None:
        sent, self.pending = self.pending, []
        committed.add_done_callback(lambda _: self._record(sent))

    def _record(self, sent: list[float]) -> None:
        now = time.time()
        self.samples.extend(now - t for t in sent)
        if len(self.samples) >= self.expected:
            self.done.set()


async def latency(client: JournalClient) -> tuple[float, float]:
    app = Latency(LATENCY_RATE * LATENCY_SECONDS)
    spec = ShardSpec("bench/latency-shard", (ShardSource("bench/latency"),))
    async with AppendQueue(client) as out, AppendQueue(client) as queue:
        runner = ShardRunner(spec, app, client, out)
        task = asyncio.create_task(runner.run())
        try:
            publisher = Publisher(queue)
            loop = asyncio.get_running_loop()
            start = loop.time()
            for i in range(LATENCY_RATE * LATENCY_SECONDS):
                due = start + i / LATENCY_RATE
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())  # the publishing rate
                publisher.publish_committed(to("bench/latency"),
                                            JsonMessage(t=time.time(), pad=PAD))
            await queue.flush()
            await asyncio.wait_for(app.done.wait(), 60)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    ms = sorted(s * 1000 for s in app.samples)
    return statistics.median(ms), ms[int(len(ms) * 0.99)]


async def run(etcd: EmbeddedEtcd, workdir: Path, dsn: str) -> dict[str, Any]:
    async with serving_broker(etcd.endpoint, workdir, SPECS,
                              ["bench/input", "bench/latency"]) as client:
        started = time.perf_counter()
        await produce(client)
        head = await client.write_head("bench/input")
        log(f"produced {MESSAGES} messages ({head / 1e6:.0f} MB) in "
            f"{time.perf_counter() - started:.1f} s")
        ceiling = await read_committed_rate(client, head)
        log(f"read-committed, no app: {ceiling:,.0f} msgs/s")
        memory, txns = await consume(client, MemoryStore(), head)
        log(f"MemoryStore: {memory:,.0f} msgs/s in {txns} transactions")
        sql_store = SQLStore(dsn, "bench/shard", pipelined=True)  # its upserts add
        sql, sql_txns = await consume(client, sql_store, head)
        log(f"SQLStore: {sql:,.0f} msgs/s in {sql_txns} transactions")
        p50, p99 = await latency(client)
        log(f"publish to commit at {LATENCY_RATE}/s: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    return {"messages": MESSAGES, "eo_msgs_per_s_memory": round(memory),
            "eo_msgs_per_s_sql": round(sql), "read_committed_msgs_per_s": round(ceiling),
            "memory_vs_read_committed": round(memory / ceiling, 2),
            "txns_memory": txns, "txns_sql": sql_txns,
            "e2e_p50_ms": round(p50, 2), "e2e_p99_ms": round(p99, 2)}


@contextlib.asynccontextmanager
async def nats_server(workdir: Path) -> Any:
    """`nats-server -js` on a free loopback port, owned by us and stopped on the way out."""
    port, log_file = free_port(), workdir / "nats-server.log"
    server = await asyncio.create_subprocess_exec(
        "nats-server", "-js", "-a", "127.0.0.1", "-p", str(port),
        "-sd", str(workdir / "jetstream"), "-l", str(log_file))
    url = f"nats://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                nc = await nats.connect(url, allow_reconnect=False, connect_timeout=1,
                                        error_cb=_ignore)
                try:
                    await nc.jetstream().account_info()
                    break
                finally:
                    await nc.close()
            except Exception as exc:  # the server is still starting
                if server.returncode is not None or time.monotonic() > deadline:
                    tail = log_file.read_text()[-2000:] if log_file.exists() else ""
                    raise RuntimeError(f"nats-server did not start ({exc!r}):\n{tail}") from exc
                await asyncio.sleep(0.1)
        yield url
    finally:
        if server.returncode is None:
            server.terminate()
        await server.wait()


async def _ignore(exc: Exception) -> None:
    """nats-py logs connection errors; while the server starts they are expected."""


async def js_produce(url: str, producer: int) -> None:
    """One producer: this producer's share of the messages, at most JS_WINDOW unacked."""
    framing, clock, pid = framing_for(NDJSON), Clock(), new_producer_id()
    clock.update()
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(publish_async_max_pending=JS_WINDOW)
        window: deque[asyncio.Future[PubAck]] = deque()
        for i in range(producer, MESSAGES, PRODUCERS):
            msg = JsonMessage(key=f"k{i % 1000}", pad=PAD)  # the keys `produce` uses
            msg.set_uuid(build(pid, clock.tick(), Flags.OUTSIDE_TXN))
            window.append(await js.publish_async(JS_SUBJECT, framing.encode([msg])))
            if len(window) >= JS_WINDOW:
                await window.popleft()  # raises if the stream refused it
        for future in window:
            await future
    finally:
        await nc.close()


async def js_consume(url: str) -> tuple[float, dict[str, int]]:
    """Counts by key at least once: fetch a batch, count it, ack its last message."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(JS_SUBJECT, durable="count-by-key", stream=JS_STREAM,
                                      config=ConsumerConfig(ack_policy=AckPolicy.ALL,
                                                            max_ack_pending=4 * JS_BATCH))
        decode, seen = msgspec.json.Decoder().decode, 0
        counts: dict[str, int] = {}
        started = time.perf_counter()
        while seen < MESSAGES:
            batch = await sub.fetch(JS_BATCH, timeout=10)
            for m in batch:
                key = decode(m.data)["key"]
                counts[key] = counts.get(key, 0) + 1
            seen += len(batch)
            if seen < MESSAGES:
                await batch[-1].ack()  # ack policy "all": every message up to this one
            else:
                await batch[-1].ack_sync(timeout=10)  # the clock stops once it is applied
        elapsed = time.perf_counter() - started
        info = await sub.consumer_info()
        if info.num_ack_pending or info.num_pending or info.num_redelivered:
            raise RuntimeError(f"JetStream consumer not fully acked: {info}")
        return seen / elapsed, counts
    finally:
        await nc.close()


async def jetstream_baseline(workdir: Path) -> float:
    """The issue's baseline: the same messages and aggregation on NATS JetStream."""
    async with nats_server(workdir) as url:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().add_stream(StreamConfig(
                name=JS_STREAM, subjects=[JS_SUBJECT], storage=StorageType.FILE))
        finally:
            await nc.close()
        started = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(js_produce(url, p) for p in range(PRODUCERS))), 300)
        log(f"JetStream: published {MESSAGES} messages in "
            f"{time.perf_counter() - started:.1f} s ({JS_WINDOW} in flight per producer)")
        rate, counts = await asyncio.wait_for(js_consume(url), 300)
    expected: dict[str, int] = {}
    for i in range(MESSAGES):
        expected[f"k{i % 1000}"] = expected.get(f"k{i % 1000}", 0) + 1
    if counts != expected:
        wrong = sorted(k for k in expected.keys() | counts.keys()
                       if counts.get(k) != expected.get(k))
        raise SystemExit(f"JetStream baseline counted wrong: {len(wrong)} keys differ, "
                         f"e.g. {wrong[:5]}")
    log(f"JetStream baseline: {rate:,.0f} msgs/s (batches of {JS_BATCH}, one ack each)")
    return rate


def main() -> None:
    if shutil.which("nats-server") is None:
        sys.exit("nats-server not found (the JetStream baseline needs it): "
                 "run scripts/ensure-bench-deps.sh")
    with tempfile.TemporaryDirectory(prefix="gz-consumer-bench-") as tmp:
        workdir = Path(tmp)
        pg = start_pg_server(Path(tempfile.mkdtemp(prefix="gz-pg-")))
        try:
            db = create_database(pg)
            import psycopg
            with psycopg.connect(db.dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE counts (key TEXT PRIMARY KEY, n BIGINT NOT NULL)")
            with EmbeddedEtcd(workdir / "etcd") as etcd:
                result = uvloop.run(run(etcd, workdir, db.dsn))
        finally:
            pg.stop()
        baseline = uvloop.run(jetstream_baseline(workdir))  # with nothing of ours running
    result["baseline_jetstream_msgs_per_s"] = round(baseline)
    result["sql_vs_jetstream"] = round(result["eo_msgs_per_s_sql"] / baseline, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
