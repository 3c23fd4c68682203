"""Consumer transactions: exactly-once messages per second, and publish-to-commit latency.

Starts etcd and a broker (its own process), writes 1 KiB ndjson messages from 4
producers in transactions of 10 (each transaction's ACK appended after it), then runs
one shard of a count-by-key application over them:

- `eo_msgs_per_s_memory`: with `MemoryStore`;
- `eo_msgs_per_s_sql`: with `SQLStore` on a local PostgreSQL (the counts upserted once
  per key per transaction, in `finalize_txn`);
- `read_committed_msgs_per_s`: the ceiling in the same run: the same bytes read and
  sequenced read-committed with no application and no commits;
- `e2e_p50_ms` / `e2e_p99_ms`: messages published committed at 1,000/s, from publish to
  the commit of the transaction that consumed them.

Prints one JSON object last. (The NATS JetStream baseline the issue names is not
measured yet.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures

import uvloop

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import Application, MemoryStore, ShardRunner
from gazette.consumer.sql import SQLStore
from gazette.keyspace import Etcd, Layout, apply_changes
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
from gazette.protocol import ShardSource, ShardSpec, journal_changes_from_yaml
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


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def to(journal: str) -> Any:
    part = Partition(journal, NDJSON)
    return lambda msg: part


class CountByKey(Application):
    """Counts messages per key, written to the store once per key per transaction."""

    def __init__(self, store: Any) -> None:
        self.store, self.txn = store, {}

    def new_store(self, shard: Any) -> Any:
        return self.store

    def consume_message(self, shard: Any, store: Any, envelope: Any, publisher: Any) -> None:
        key = envelope.message["key"]
        self.txn[key] = self.txn.get(key, 0) + 1

    async def finalize_txn(self, shard: Any, store: Any, publisher: Any) -> None:
        txn, self.txn = self.txn, {}
        if isinstance(store, SQLStore):
            for key, n in txn.items():
                await store.execute(
                    "INSERT INTO counts (key, n) VALUES (%s, %s) ON CONFLICT (key) "
                    "DO UPDATE SET n = counts.n + EXCLUDED.n", (key, n))
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
    port = free_port()
    broker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette_broker", "serve", "--broker.port", str(port),
        "--broker.http-port", "-1", "--broker.host", "127.0.0.1", "--broker.file-root",
        str(workdir / "store"), "--broker.spool-dir", str(workdir / "spools"),
        "--etcd.address", etcd.endpoint, "--log.level", "warn", env=dict(os.environ))
    try:
        async with Etcd(etcd.endpoint) as client_etcd:
            await apply_changes(client_etcd, Layout.brokers(),
                                journal_changes_from_yaml(SPECS))
        async with JournalClient(f"127.0.0.1:{port}") as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    await client.write_head("bench/latency")
                    break
                except Exception:  # noqa: BLE001 - the broker is still starting
                    assert time.monotonic() < deadline, "the broker did not start"
                    await asyncio.sleep(0.1)
            started = time.perf_counter()
            await produce(client)
            head = await client.write_head("bench/input")
            log(f"produced {MESSAGES} messages ({head / 1e6:.0f} MB) in "
                f"{time.perf_counter() - started:.1f} s")
            ceiling = await read_committed_rate(client, head)
            log(f"read-committed, no app: {ceiling:,.0f} msgs/s")
            memory, txns = await consume(client, MemoryStore(), head)
            log(f"MemoryStore: {memory:,.0f} msgs/s in {txns} transactions")
            sql_store = SQLStore(dsn, "bench/shard")
            sql, sql_txns = await consume(client, sql_store, head)
            log(f"SQLStore: {sql:,.0f} msgs/s in {sql_txns} transactions")
            p50, p99 = await latency(client)
            log(f"publish to commit at {LATENCY_RATE}/s: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    finally:
        broker.terminate()
        await broker.wait()
    return {"messages": MESSAGES, "eo_msgs_per_s_memory": round(memory),
            "eo_msgs_per_s_sql": round(sql), "read_committed_msgs_per_s": round(ceiling),
            "memory_vs_read_committed": round(memory / ceiling, 2),
            "txns_memory": txns, "txns_sql": sql_txns,
            "e2e_p50_ms": round(p50, 2), "e2e_p99_ms": round(p99, 2)}


def main() -> None:
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
    print(json.dumps(result))


if __name__ == "__main__":
    main()
