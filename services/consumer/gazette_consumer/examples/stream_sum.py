"""Stream-sum, after Gazette's example: an exactly-once check that runs as an application.

Chunks ``{stream_id, seq, data}`` of many streams are published to the journals
``examples/stream-sum/chunks/part-NNN`` (a stream's chunks all to one journal, by key);
a stream's last chunk has empty ``data``. `StreamSum` shards (one per journal) keep each
stream's running sum, chunk count and last ``seq`` in their store and, at the last chunk,
publish ``{stream_id, sum, chunks}`` to ``examples/stream-sum/sums``. A chunk whose
``seq`` is not the last one plus 1 fails the shard (`SequenceError`): the framework
promises each committed message once, in order, so a gap or a repeat is a bug.

The store: a `SQLiteStore` in the shard's folder when the shard has a recovery log
(``setup(..., recovery_logs=True)``), else `SQLStore` on ``$STREAM_SUM_DSN`` if set, else a
`JSONFileStore` per shard in ``$STREAM_SUM_DIR`` if set, else a `MemoryStore` per shard
(kept by the application).

The driver (`Driver`, or ``python -m gazette_consumer.examples.stream_sum run``) publishes
streams interleaved: some chunks committed at once (some appended twice), some in
transactions, some in transactions rolled back and then sent again; it then reads the
sums and fails on any that is wrong, repeated or missing. ``setup`` makes the journals and
shards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import Application, JSONFileStore, MemoryStore, Shard, Store
from gazette.errors import GazetteError
from gazette.keyspace import CONSUMER_ROOT, Etcd, Layout
from gazette.labels import Selector
from gazette.message import (
    AckIntent,
    DataclassMessage,
    Envelope,
    Partition,
    Publisher,
    Sequencer,
    StaticPartitions,
    drain,
    framing_for,
    modulo_mapping,
    read_uncommitted,
)
from gazette.message.uuid import unix_time_of
from gazette.protocol import JournalSpec, ShardSource, ShardSpec
from gazette_consumer.examples.setup import ensure_journals, ensure_shards
from gazette_consumer.examples.stream_sum_stores import SqliteSums, SqlSums

NDJSON = "application/x-ndjson"
PREFIX = "examples/stream-sum"
CHUNKS = f"{PREFIX}/chunks/"
SUMS = f"{PREFIX}/sums"
LOGS = f"{PREFIX}/logs/"
APP = "stream-sum"


@dataclass(slots=True)
class Chunk(DataclassMessage):
    """Chunk `seq` (from 1) of a stream; empty `data` ends the stream."""

    stream_id: str = ""
    seq: int = 0
    data: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Sum(DataclassMessage):
    """A finished stream: the sum of its data and its number of data chunks."""

    stream_id: str = ""
    sum: int = 0
    chunks: int = 0


class SequenceError(GazetteError):
    """A chunk out of sequence reached the application: exactly-once was broken."""


class StreamSum(Application):
    """Sums streams of chunks; publishes each stream's `Sum` to `output` at its end."""

    def __init__(self, dsn: str | None = None, directory: Path | str | None = None,
                 output: str = SUMS) -> None:
        self.dsn = dsn or os.environ.get("STREAM_SUM_DSN") or None
        folder = directory or os.environ.get("STREAM_SUM_DIR")
        self.directory = Path(folder) if folder else None
        self.output = Partition(output, NDJSON)
        self._memory: dict[str, MemoryStore] = {}  # a restarted shard finds its commits

    def new_store(self, shard: Shard) -> Store:
        if shard.folder is not None:
            return SqliteSums(shard)
        if self.dsn:
            return SqlSums(self.dsn, APP, shard.id)
        if self.directory is not None:
            return JSONFileStore(self.directory / f"{shard.id.replace('/', '_')}.json")
        return self._memory.setdefault(shard.id, MemoryStore())

    def message_type(self, journal: JournalSpec) -> Any:
        return Chunk

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        chunk: Chunk = envelope.message
        last = store.state.get(chunk.stream_id) or {"seq": 0, "sum": 0, "chunks": 0,
                                                    "done": False}
        if last["done"] or chunk.seq != last["seq"] + 1:
            raise SequenceError(
                f"shard {shard.id}: stream {chunk.stream_id}: chunk {chunk.seq} follows "
                f"chunk {last['seq']}{' (its last)' if last['done'] else ''} (at "
                f"{envelope.journal}:{envelope.begin}): a repeat or a gap reached the app")
        done = not chunk.data
        # A new dict, never changed in place: MemoryStore's commit keeps a shallow copy.
        row = {"seq": chunk.seq, "sum": last["sum"] + sum(chunk.data),
               "chunks": last["chunks"] + (not done), "done": done}
        store.state[chunk.stream_id] = row
        if isinstance(store, (SqlSums, SqliteSums)):
            store.dirty.add(chunk.stream_id)
        if done:
            publisher.publish_uncommitted(lambda _: self.output, Sum(
                chunk.stream_id, row["sum"], row["chunks"]))

    async def finalize_txn(self, shard: Shard, store: Any, publisher: Publisher) -> None:
        if isinstance(store, SqlSums):
            await store.write()
        elif isinstance(store, SqliteSums):
            store.write()


def shard_id(part: int) -> str:
    return f"{APP}/part-{part:03d}"


async def setup(client: JournalClient, etcd: Etcd, *, partitions: int = 4,
                replication: int = 1, fragment_store: str = "file:///",
                app_name: str = APP, etcd_root: str = CONSUMER_ROOT,
                recovery_logs: bool = False, hot_standbys: int = 0) -> None:
    """Make the journals and one shard per chunk journal, where missing. With
    `recovery_logs`, each shard keeps its sums in SQLite on a recovery log
    (``examples/stream-sum/logs/<shard>``, hints under ``<etcd_root>/hints``)."""
    journals = [f"{CHUNKS}part-{i:03d}" for i in range(partitions)]
    await ensure_journals(client, f"{PREFIX}/", [*journals, SUMS],
                          replication=replication, fragment_store=fragment_store)
    extra: dict[str, Any] = {}
    if recovery_logs:
        await ensure_journals(client, LOGS, [f"{LOGS}{shard_id(i)}" for i in
                                             range(partitions)], replication=replication,
                              fragment_store=fragment_store,
                              content_type="application/octet-stream")
        extra = {"recovery_log_prefix": LOGS.rstrip("/"), "hint_prefix": f"{etcd_root}/hints"}
    await ensure_shards(etcd, Layout.consumer_app(app_name, etcd_root), [
        ShardSpec(shard_id(i), (ShardSource(journal),), hot_standbys=hot_standbys, **extra)
        for i, journal in enumerate(journals)])


class _Appender:
    """The driver's `AppendClient`: an `AppendQueue` that sends an append in doubt again
    until it commits (readers drop a repeat), remembering each journal's last append (to
    send it twice on purpose) and the appends `flush` waits for."""

    def __init__(self, client: JournalClient) -> None:
        self.queue = AppendQueue(client, resend=True)
        self.last: dict[str, bytes] = {}
        self._waiting: list[asyncio.Future[Any]] = []

    def append(self, journal: str, data: bytes) -> asyncio.Future[Any]:
        self.last[journal] = data
        fut = self.queue.append(journal, data)
        self._waiting.append(fut)
        return fut

    async def flush(self, timeout: float) -> None:
        """Wait until everything appended so far committed (raises the first failure)."""
        waiting, self._waiting = self._waiting, []
        async with asyncio.timeout(timeout):
            await asyncio.gather(*waiting)


@dataclass
class _Stream:
    id: str
    data: list[list[int]]
    sent: int = 0  # chunks committed (or about to be, in the open transaction)

    def chunk(self) -> Chunk:
        """The next chunk: data, or the empty last one."""
        return Chunk(self.id, self.sent + 1, self.data[self.sent] if self.sent < len(
            self.data) else [])

    @property
    def finished(self) -> bool:
        return self.sent > len(self.data)


@dataclass
class Summary:
    """What the driver sent, and how the sums it read compare (lists: stream ids)."""

    streams: int = 0
    chunks: int = 0
    transactions: int = 0
    rolled_back: int = 0
    resent: int = 0
    exact: int = 0
    wrong: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The longest a stream waited, from its last chunk committed to its sum published
    #: (the sum's UUID time): the longest processing pause, plus the usual latency.
    longest_wait: float = 0.0

    @property
    def ok(self) -> bool:
        return self.streams > 0 and self.exact == self.streams and not (
            self.wrong or self.duplicated or self.missing)

    def line(self) -> str:
        """One line of JSON (lists cut to 10, and counted)."""
        fields = vars(self).items()
        out = {"ok": self.ok, **{k: v[:10] if isinstance(v, list) else v for k, v in fields},
               **{f"{k}_count": len(v) for k, v in fields if isinstance(v, list)}}
        out["seconds"] = round(self.seconds, 2)
        out["longest_wait"] = round(self.longest_wait, 3)
        return json.dumps(out, separators=(",", ":"))


class Driver:
    """Publishes streams to the chunk journals through `client` and checks their sums
    on `output`. ``async with Driver(client) as d: await d.publish(...); await
    d.verify(...)``; `publish` may be called many times (each call adds new streams)."""

    def __init__(self, client: JournalClient, *, output: str = SUMS, seed: int | None = None,
                 tag: str | None = None, give_up: float = 120.0) -> None:
        self.client, self.output = client, output
        self.rng = random.Random(seed)
        self.tag = tag or uuid.uuid4().hex[:8]
        self.appender, self.give_up = _Appender(client), give_up
        self.publisher = Publisher(self.appender)
        self.expected: dict[str, tuple[int, int]] = {}  # stream -> (sum, chunks)
        self.results: dict[str, list[tuple[int, int]]] = {}
        #: Stream -> when its last chunk was committed (Unix time, once its round's
        #: appends were acknowledged), and how long its sum took after that.
        self.finished_at: dict[str, float] = {}
        self.waits: dict[str, float] = {}
        self.sum_uuids: dict[str, int] = {}  # stream -> its first sum's UUID
        self.summary = Summary()
        self._started = time.monotonic()
        self._offset = 0
        self._sequencer = Sequencer()
        self._framing = framing_for(NDJSON, message_type=Sum)
        self._map: Any = None

    async def __aenter__(self) -> Driver:
        specs = [j.spec for j in (await self.client.list(f"prefix={CHUNKS}")).journals]
        if not specs:
            raise GazetteError(f"no journals under {CHUNKS}: run `setup` first")
        self._map = modulo_mapping(lambda c: c.stream_id.encode(), StaticPartitions(
            specs, Selector.parse(f"prefix={CHUNKS}")))
        self._offset = await self.client.write_head(self.output)  # sums of this run only
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        # On an error, what is unresolved is given up: a resend waiting on brokers that
        # refuse it would otherwise hold the caller (and hide its error) indefinitely.
        await self.appender.queue.close(flush=exc_type is None)

    async def publish(self, streams: int, chunks: int, pace: float = 0.0) -> None:
        """Publish `streams` new streams of `chunks` data chunks each (and their last,
        empty one), interleaved, a few streams a round, waiting for each round's appends
        (`pace`: seconds between rounds)."""
        rng, first = self.rng, len(self.expected)
        wave = [_Stream(f"{self.tag}-{first + i:05d}", [
            list(rng.randbytes(rng.randint(1, 8))) for _ in range(chunks)])
            for i in range(streams)]
        for s in wave:
            self.expected[s.id] = (sum(map(sum, s.data)), chunks)
        active = wave
        while active:
            picked = rng.sample(active, min(len(active), rng.randint(1, 4)))
            roll = rng.random()
            if roll < 0.4:
                self._committed(picked)
            elif roll < 0.7:
                self._transaction(picked)
            else:
                self._rolled_back(picked)
            await self.appender.flush(self.give_up)
            now = time.time()
            for s in active:
                if s.finished:
                    self.finished_at.setdefault(s.id, now)
            active = [s for s in active if not s.finished]
            if pace:
                await asyncio.sleep(pace)  # pacing, not synchronization

    def _committed(self, streams: list[_Stream]) -> None:
        """Each stream's next chunk committed at once; some appended a second time."""
        for s in streams:
            chunk = s.chunk()
            self.publisher.publish_committed(self._map, chunk)
            s.sent += 1
            self.summary.chunks += 1
            if self.rng.random() < 0.3:
                journal = self._map(chunk).journal
                self.appender.append(journal, self.appender.last[journal])
                self.summary.resent += 1

    def _transaction(self, streams: list[_Stream]) -> list[AckIntent]:
        """Each stream's next chunk in one transaction, committed by its ACKs."""
        for s in streams:
            self.publisher.publish_uncommitted(self._map, s.chunk())
            s.sent += 1
            self.summary.chunks += 1
        intents = self.publisher.build_ack_intents()
        for intent in intents:
            self.appender.append(intent.journal, intent.data)
        self.summary.transactions += 1
        return intents

    def _rolled_back(self, streams: list[_Stream]) -> None:
        """A committed transaction, then one of the next chunks that is rolled back (its
        producer "restarts" and writes its last ACKs again); those chunks are sent again
        in a later round. Not in this one: were an append of this round sent twice (its
        outcome unknown), the repeat of the old ACK, read after chunks committed since,
        would mean a producer recovered from an older checkpoint, and readers would
        take those chunks again (at-least-once, as in Gazette)."""
        acks = self._transaction(streams)
        streams = [s for s in streams if not s.finished]
        if not streams:
            return
        for s in streams:
            self.publisher.publish_uncommitted(self._map, s.chunk())
        self.publisher.build_ack_intents()  # the lost transaction's: never written
        for intent in acks:
            self.appender.append(intent.journal, intent.data)
        self.summary.rolled_back += 1

    async def _replay(self, journal: str, begin: int, end: int
                      ) -> AsyncIterator[list[Envelope]]:
        async with contextlib.aclosing(self.client.read(journal, begin, end_offset=end)) \
                as chunks:
            async for batch in read_uncommitted(journal, _contents(chunks), self._framing,
                                                begin):
                yield batch

    async def _read(self, block: bool) -> None:
        """Read sums from where the last read stopped: through the write head, or (with
        `block`) until every expected stream has one."""
        head = 0 if block else await self.client.write_head(self.output)
        if not block and head <= self._offset:
            return
        reads = self.client.read(self.output, self._offset, block=block, end_offset=head)
        async with contextlib.aclosing(reads) as chunks:
            async for batch in read_uncommitted(self.output, _contents(chunks),
                                                self._framing, self._offset):
                self._sequencer.queue_all(batch)
                for env in await drain(self._sequencer, self._replay):
                    msg: Sum = env.message
                    if msg.stream_id in self.expected:
                        self.results.setdefault(msg.stream_id, []).append(
                            (msg.sum, msg.chunks))
                        self.sum_uuids.setdefault(msg.stream_id, env.uuid)
                        if (at := self.finished_at.get(msg.stream_id)) is not None:
                            self.waits.setdefault(msg.stream_id,
                                                  max(0.0, unix_time_of(env.uuid) - at))
                self._offset = batch[-1].end
                if block and self.results.keys() >= self.expected.keys():
                    return

    def _compare(self) -> Summary:
        out = self.summary
        out.streams, out.exact = len(self.expected), 0
        out.wrong, out.duplicated, out.missing = [], [], []
        for stream, want in self.expected.items():
            got = self.results.get(stream, [])
            if not got:
                out.missing.append(stream)
            elif len(got) > 1:
                out.duplicated.append(stream)
            elif got[0] != want:
                out.wrong.append(f"{stream}: sum {got[0][0]} of {got[0][1]} chunks, "
                                 f"expected {want[0]} of {want[1]}")
            else:
                out.exact += 1
        out.seconds = time.monotonic() - self._started
        out.longest_wait = max(self.waits.values(), default=0.0)
        return out

    async def check(self) -> Summary:
        """The sums read through the output's current write head, compared."""
        await self._read(block=False)
        return self._compare()

    async def verify(self, timeout: float) -> Summary:
        """Wait (up to `timeout` seconds) until every stream has a sum; compare them all,
        and any repeat already written."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._read(block=True)
        return await self.check()


async def _contents(chunks: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk.content


async def run(broker: str, streams: int, chunks: int, *, timeout: float = 60.0,
              seed: int | None = None, pace: float = 0.0) -> Summary:
    """The driver's core: publish, then wait for and check every sum."""
    async with JournalClient(broker) as client, Driver(client, seed=seed) as driver:
        await driver.publish(streams, chunks, pace)
        return await driver.verify(timeout)


async def _main(args: argparse.Namespace) -> int:
    if args.command == "setup" or args.etcd_address:
        async with JournalClient(args.broker_address) as client, \
                Etcd(args.etcd_address) as etcd:
            await setup(client, etcd, partitions=args.partitions,
                        replication=args.replication, fragment_store=args.fragment_store,
                        app_name=args.app_name, etcd_root=args.etcd_prefix,
                        recovery_logs=args.recovery_logs, hot_standbys=args.hot_standbys)
    if args.command == "setup":
        return 0
    summary = await run(args.broker_address, args.streams, args.chunks,
                        timeout=args.timeout, seed=args.seed, pace=args.pace)
    print(summary.line())
    return 0 if summary.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gazette_consumer.examples.stream_sum",
                                     description="Stream-sum: set up, and drive and check.")
    sub = parser.add_subparsers(dest="command", required=True)
    setup_ = sub.add_parser("setup", help="make the journals and shards where missing")
    drive = sub.add_parser("run", help="publish streams, then check every stream's sum "
                           "(exit 1 if one is wrong, repeated or missing)")
    for p in (setup_, drive):
        p.add_argument("--broker.address", dest="broker_address", default=os.environ.get(
            "BROKER_ADDRESS", "localhost:8080"), help="a broker [$BROKER_ADDRESS]")
        etcd = os.environ.get("ETCD_ADDRESS") if p is setup_ else None
        p.add_argument("--etcd.address", dest="etcd_address", default=etcd,
                       required=p is setup_ and not etcd,
                       help="etcd, where the shards are made" + (
                           " (if given, `setup` runs first)" if p is drive
                           else " [$ETCD_ADDRESS]"))
        p.add_argument("--etcd.prefix", dest="etcd_prefix", default=CONSUMER_ROOT)
        p.add_argument("--app-name", default=APP)
        p.add_argument("--partitions", type=int, default=4, help="chunk journals")
        p.add_argument("--replication", type=int, default=1)
        p.add_argument("--fragment-store", default="file:///")
        p.add_argument("--recovery-logs", action="store_true",
                       help="shards keep their sums in SQLite on recovery logs")
        p.add_argument("--hot-standbys", type=int, default=0,
                       help="members keeping a current copy of each shard's store")
    drive.add_argument("--streams", type=int, default=10)
    drive.add_argument("--chunks", type=int, default=20, help="data chunks per stream")
    drive.add_argument("--timeout", type=float, default=60.0,
                       help="seconds to wait for the sums")
    drive.add_argument("--seed", type=int, default=None)
    drive.add_argument("--pace", type=float, default=0.0, help="seconds between rounds")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return uvloop.run(_main(args))
    except GazetteError as err:
        print(f"stream-sum: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
