"""The ``gazette`` PySpark source over fragments real brokers wrote: to ``file://`` and to
S3 on moto, in every codec and framing; offsets, selectors, duplicate fragments, a corrupt
one, read-committed against the message library's reader, and the streaming source.
The tests of lines run twice (`gazette`): through the Python data source and through
`gazette_spark.read`, whose JVM reader is the native path.

Spark calls block, and the brokers run on this test's event loop: they are made from a
worker thread (`run`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gazette.client import JournalClient
from gazette.message import (
    CsvRecord,
    JsonMessage,
    ProtoMessage,
    Sequencer,
    framing_for,
    read_committed,
    read_uncommitted,
)
from gazette.message.uuid import Flags, build, to_str
from gazette_broker import BrokerServer
from tests.fixtures.broker import persist
from tests.fixtures.polling import eventually
from tests.fixtures.s3 import S3Bucket
from tests.unit.message.test_types import TextEvent

pytestmark = pytest.mark.integration

T = TypeVar("T")
CODECS = ["NONE", "GZIP", "SNAPPY", "ZSTANDARD", "GZIP_OFFLOAD_DECOMPRESSION"]
SPECS = """
name: spark/
replication: 1
fragment: {length: 1073741824, stores: ["file:///"], refresh_interval: 1h0m0s}
children:
""" + "".join(f"""  - name: spark/lines-{c.lower()}
    fragment: {{compression_codec: {c}}}
""" for c in CODECS) + """  - name: spark/events
    fragment: {compression_codec: SNAPPY}
  - name: spark/other/x
"""


async def run(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


def lines_of(journal: str, n: int, part: int) -> bytes:
    return b"".join(b"%s part %d line %d\n" % (journal.encode(), part, i) for i in range(n))


def expected_rows(parts: list[bytes]) -> list[tuple[int, str]]:
    out, offset = [], 0
    for line in b"".join(parts).splitlines(keepends=True):
        out.append((offset, line.rstrip(b"\n").decode()))
        offset += len(line)
    return out


@pytest.fixture
async def written(broker_server: BrokerServer) -> AsyncIterator[dict[str, list[bytes]]]:
    """Journals of three fragments each, persisted to the broker's file store."""
    await broker_server.apply_yaml(SPECS)
    parts: dict[str, list[bytes]] = {}
    async with JournalClient(broker_server.grpc_address) as client:
        for codec in CODECS:
            journal = f"spark/lines-{codec.lower()}"
            parts[journal] = [lines_of(journal, 200 + 50 * i, i) for i in range(3)]
            await persist(broker_server, client, journal, parts[journal])
        parts["spark/other/x"] = [b"other\n"]
        await persist(broker_server, client, "spark/other/x", parts["spark/other/x"])
    yield parts


def store_url(broker: BrokerServer) -> str:
    return Path(broker.file_root or "").as_uri() + "/"


def rows(df: Any) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for r in df.orderBy("journal", "offset").collect():
        out.setdefault(r["journal"], []).append((r["offset"], r["value"]))
    return out


async def test_every_codec_from_a_file_store_and_through_a_broker(
        spark: Any, gazette: Any, broker_server: BrokerServer,
        written: dict[str, list[bytes]]) -> None:
    want = {j: expected_rows(p) for j, p in written.items() if j.startswith("spark/lines")}
    from_stores = gazette().option("stores", store_url(broker_server)) \
        .option("journals", "prefix=spark/, name notin (spark/other/x)")
    assert await run(lambda: rows(from_stores.load())) == want
    through_broker = gazette().options(
        broker=broker_server.grpc_address, journals="prefix=spark/, name notin (spark/other/x)")
    df = await run(through_broker.load)
    assert df.columns == ["journal", "offset", "value"]
    assert await run(lambda: rows(df)) == want


async def test_offsets_selectors_and_times_narrow_the_read(
        spark: Any, gazette: Any, broker_server: BrokerServer,
        written: dict[str, list[bytes]]) -> None:
    journal = "spark/lines-gzip"
    all_rows = expected_rows(written[journal])
    start, end = all_rows[10][0], all_rows[300][0]
    reader = gazette().options(
        stores=store_url(broker_server), journals=f"name={journal}",
        startingOffsets=json.dumps({journal: start}),
        endingOffsets=json.dumps({journal: end}))
    assert await run(lambda: rows(reader.load())) == {journal: all_rows[10:300]}
    # A selector that excludes, and a time range that holds nothing.
    excluding = gazette().options(
        stores=store_url(broker_server),
        journals="prefix=spark/, name notin (spark/lines-none, spark/lines-gzip)")
    got = await run(lambda: sorted(rows(excluding.load())))
    assert got == ["spark/lines-gzip_offload_decompression", "spark/lines-snappy",
                   "spark/lines-zstandard", "spark/other/x"]
    future = gazette().options(
        stores=store_url(broker_server), journals="prefix=spark/", startTime="2999-01-01")
    assert await run(lambda: future.load().count()) == 0


async def test_duplicate_fragments_in_two_stores_are_read_once(
        spark: Any, gazette: Any, broker_server: BrokerServer, written: dict[str, list[bytes]],
        tmp_path: Path) -> None:
    root = Path(broker_server.file_root or "")
    copy = tmp_path / "second-store"
    shutil.copytree(root / "spark" / "lines-snappy", copy / "spark" / "lines-snappy")
    stores = f"{store_url(broker_server)},{copy.as_uri()}/"
    df = gazette().options(stores=stores,
                                              journals="name=spark/lines-snappy")
    assert await run(lambda: rows(df.load())) == {
        "spark/lines-snappy": expected_rows(written["spark/lines-snappy"])}
    # Only in the second store, the first fragment is found there.
    first = next((root / "spark" / "lines-snappy").iterdir())
    first.unlink()
    assert await run(lambda: rows(df.load())) == {
        "spark/lines-snappy": expected_rows(written["spark/lines-snappy"])}


async def test_a_corrupt_fragment_fails_the_read_naming_it_unless_told_to_skip(
        spark: Any, gazette: Any, broker_server: BrokerServer,
        written: dict[str, list[bytes]]) -> None:
    journal = "spark/lines-zstandard"
    folder = Path(broker_server.file_root or "") / journal
    frags = sorted(folder.iterdir())
    bad = frags[1]
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    def reader(**extra: str) -> Any:  # a new one each time: option() changes a reader
        return gazette().options(
            stores=store_url(broker_server), journals=f"name={journal}", **extra)

    with pytest.raises(Exception) as err:
        await run(lambda: reader().load().count())
    assert bad.name in str(err.value) and "failOnDataLoss=false" in str(err.value)
    lenient = reader(failOnDataLoss="false")
    got = await run(lambda: rows(lenient.load()))
    parts = written[journal]
    keep = expected_rows(parts)
    skipped = range(len(parts[0]), len(parts[0]) + len(parts[1]))
    assert got == {journal: [r for r in keep if r[0] not in skipped]}
    # A fragment gone from the store leaves a hole. Fragments after it were persisted
    # moments ago: it may be an upload still under way, so a read stops before it...
    bad.unlink()
    assert await run(lambda: rows(reader().load())) == {
        journal: [r for r in keep if r[0] < skipped.start]}
    # ...and past `holeGraceSeconds` it is lost: named, or skipped when allowed.
    with pytest.raises(Exception) as err:
        await run(lambda: reader(holeGraceSeconds="0").load().count())
    assert f"bytes [{skipped.start}, {skipped.stop}) are missing" in str(err.value)
    assert await run(lambda: rows(lenient.load())) == {
        journal: [r for r in keep if r[0] < skipped.start]}
    assert await run(lambda: rows(reader(failOnDataLoss="false",
                                         holeGraceSeconds="0").load())) == got


# -- framings and S3 ---------------------------------------------------------------------

def uuid_text(producer: int, clock: int, flags: Flags = Flags.OUTSIDE_TXN) -> str:
    return to_str(build(producer, clock << 4, flags))


async def test_json_csv_and_fixed_framings_from_s3(
        spark: Any, broker_server: BrokerServer, s3_bucket: S3Bucket,
        monkeypatch: pytest.MonkeyPatch) -> None:
    s3_bucket.server.export_env(monkeypatch)  # the in-process broker's S3 store
    await broker_server.apply_yaml(f"""
name: s3/
replication: 1
fragment: {{compression_codec: ZSTANDARD, stores: ["{s3_bucket.url}frags/"]}}
children:
  - name: s3/json
  - name: s3/csv
  - name: s3/fixed
""")
    docs = [JsonMessage(uuid=uuid_text(7, i + 1), word=f"w{i}", n=i) for i in range(500)]
    docs.append(JsonMessage(word="no uuid", n=-1))
    ndjson = framing_for("application/x-ndjson")
    csv = framing_for("text/csv")
    records = [CsvRecord([uuid_text(9, i + 1), f"c{i}", "x,y"]) for i in range(100)]
    fixed = framing_for("application/x-protobuf-fixed", message_type=TextEvent)
    events = []
    for i in range(100):
        ev = ProtoMessage(TextEvent(name=f"e{i}", n=i))
        ev.set_uuid(build(11, (i + 1) << 4, Flags.OUTSIDE_TXN))
        events.append(ev)
    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, "s3/json",
                      [ndjson.encode(docs[:250]), ndjson.encode(docs[250:])])
        await persist(broker_server, client, "s3/csv", [csv.encode(records)])
        await persist(broker_server, client, "s3/fixed", [fixed.encode(events)])
    stores = f"{s3_bucket.url}frags/"

    js = spark.read.format("gazette").options(stores=stores, journals="name=s3/json",
                                              framing="json", schema="word string, n int")
    got = await run(lambda: js.load().orderBy("offset").collect())
    assert len(got) == 501
    assert [(r["data"]["word"], r["data"]["n"]) for r in got] == [
        (d["word"], d["n"]) for d in docs]
    first = got[0]
    assert first["uuid"] == docs[0]["uuid"] and first["producer"] == f"{7:012x}"
    assert first["clock"] == 1 << 4 and first["flags"] == 0
    assert got[-1]["uuid"] is None and got[-1]["clock"] is None

    cs = spark.read.format("gazette").options(stores=stores, journals="name=s3/csv",
                                              framing="csv")
    got = await run(lambda: cs.load().orderBy("offset").collect())
    assert [r["value"] for r in got] == [f'{r[0]},{r[1]},"x,y"' for r in records]
    assert {r["producer"] for r in got} == {f"{9:012x}"}

    fx = spark.read.format("gazette").options(
        stores=stores, journals="name=s3/fixed", framing="fixed",
        messageType="tests.unit.message.test_types:TextEvent")
    got = await run(lambda: fx.load().orderBy("offset").collect())
    assert [TextEvent.FromString(bytes(r["value"])).name for r in got] == [
        f"e{i}" for i in range(100)]
    assert [r["clock"] for r in got] == [(i + 1) << 4 for i in range(100)]
    # Through the broker, with signed (presigned S3) URLs.
    via = js.options(broker=broker_server.grpc_address, stores="")
    assert await run(lambda: via.load().count()) == 501


# -- read committed ---------------------------------------------------------------------

def transactional_stream() -> list[bytes]:
    """Appends of three producers: committed publishing with a re-sent append, a
    committed transaction, a rolled-back one, a recovered producer re-writing its ACK,
    and messages without UUIDs; ACKs too."""
    enc = framing_for("application/x-ndjson")

    def msg(p: int, clock: int, flags: Flags, n: int) -> JsonMessage:
        return JsonMessage(uuid=uuid_text(p, clock, flags), n=n)

    c, a = Flags.CONTINUE_TXN, Flags.ACK_TXN
    o = Flags.OUTSIDE_TXN
    appends = [
        [msg(1, i, o, i) for i in range(1, 300)],
        [msg(1, i, o, i) for i in range(250, 300)],  # a re-sent append: duplicates
        [msg(2, 1, c, 1000), msg(2, 2, c, 1001), msg(3, 1, c, 2000)],
        [msg(2, 3, a, -1)],  # commits 1000, 1001
        [msg(3, 2, c, 2001), msg(2, 4, c, 1002)],
        [msg(3, 1, a, -1)],  # producer 3 acks clock 1: 2001 (clock 2) rolls back
        [msg(2, 3, a, -1)],  # producer 2 re-writes its last ACK: 1002 rolls back
        [JsonMessage(n=5000), msg(1, 300, o, 300)],
        [msg(4, 1, c, 4000 + i) for i in range(10)] + [msg(4, 2, a, -1)],
    ]
    return [enc.encode(batch) for batch in appends]


async def library_committed(journal: str, content: bytes) -> list[tuple[int, str]]:
    async def chunks() -> AsyncIterator[bytes]:
        yield content

    async def replay(_: str, begin: int, end: int) -> AsyncIterator[list[Any]]:
        async def part() -> AsyncIterator[bytes]:
            yield content[begin:end]
        async for batch in read_uncommitted(journal, part(), ndjson, begin):
            yield batch

    ndjson = framing_for("application/x-ndjson")
    out = []
    async for batch in read_committed(read_uncommitted(journal, chunks(), ndjson),
                                      Sequencer(), replay):
        out.extend((env.begin, json.dumps(env.message, separators=(",", ":")))
                   for env in batch)
    return out


async def test_read_committed_equals_the_message_library_reader(
        spark: Any, broker_server: BrokerServer) -> None:
    await broker_server.apply_yaml(SPECS)
    parts = transactional_stream()
    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, "spark/events", parts)
    content = b"".join(parts)
    want = await library_committed("spark/events", content)
    assert 300 < len(want) < 400  # duplicates, roll-backs and ACKs are gone
    df = spark.read.format("gazette").options(
        stores=store_url(broker_server), journals="name=spark/events", framing="json",
        readCommitted="true", schema="n bigint")
    got = await run(lambda: [(r["offset"], r["value"], r["data"]["n"])
                             for r in df.load().collect()])
    assert [(o, json.loads(v)) for o, v, _ in got] == [(o, json.loads(v)) for o, v in want]
    assert [n for _, _, n in got] == [json.loads(v).get("n") for _, v in want]
    everything = await run(lambda: df.option("readCommitted", "false").load().count())
    assert everything == sum(len(p.splitlines()) for p in parts)


async def test_a_committed_stream_equals_the_batch_read_committed_result(
        spark: Any, broker_server: BrokerServer, tmp_path: Path) -> None:
    """A fragment a micro-batch (maxBytesPerTrigger), so transactions, duplicates and
    roll-backs fall across batches, and the query stopped after three batches and
    resumed from its checkpoint: the stream's rows are the batch read's, each once. An
    offset keeps a pending transaction's begin (the next batch replays it when its ACK
    comes)."""
    import time

    await broker_server.apply_yaml(SPECS)
    parts = transactional_stream()
    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, "spark/events", parts)
    options = {"stores": store_url(broker_server), "journals": "name=spark/events",
               "framing": "json", "readCommitted": "true", "schema": "n bigint"}
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(**trigger: Any) -> Any:
        df = spark.readStream.format("gazette").options(
            **options, maxBytesPerTrigger="1").load()
        return (df.writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())

    def some() -> list[Any]:
        query = start(processingTime="0 seconds")
        deadline = time.monotonic() + 120
        while len(query.recentProgress) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the query's progress under a deadline
        query.stop()
        return list(query.recentProgress)

    def rest() -> list[Any]:
        query = start(availableNow=True)
        query.awaitTermination(180)
        assert not query.isActive and query.exception() is None, query.exception()
        return list(query.recentProgress)

    progress = await run(some) + await run(rest)
    assert len(progress) == len(parts)  # (a fragment a batch, none twice)
    ends = [json.loads(p.sources[0].endOffset)["spark/events"] for p in progress]
    assert any(begin >= 0 for end in ends for _, _, begin, _ in end["producers"])

    def table(df: Any) -> list[tuple[int, str, int | None]]:
        return sorted((r["offset"], r["value"], r["data"]["n"]) for r in df.collect())

    batch = spark.read.format("gazette").options(**options)
    want = await run(lambda: table(batch.load()))
    assert 300 < len(want) < 400
    assert await run(lambda: table(spark.read.parquet(str(out)))) == want


# -- partitions ---------------------------------------------------------------------------

async def test_a_large_fragment_is_split_and_read_whole(
        spark: Any, gazette: Any, broker_server: BrokerServer) -> None:
    await broker_server.apply_yaml(SPECS)
    part = b"".join(b"line %06d %s\n" % (i, b"x" * (i % 97)) for i in range(40_000))
    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, "spark/lines-none", [part])
    df = gazette().options(
        stores=store_url(broker_server), journals="name=spark/lines-none",
        maxPartitionBytes=str(256 << 10))
    loaded = await run(df.load)
    assert await run(lambda: loaded.rdd.getNumPartitions()) == -(-len(part) // (256 << 10))
    assert await run(lambda: rows(loaded)) == {"spark/lines-none": expected_rows([part])}
    hinted = gazette().options(
        stores=store_url(broker_server), journals="name=spark/lines-none", minPartitions="7")
    assert await run(lambda: hinted.load().rdd.getNumPartitions()) >= 7


# -- streaming ---------------------------------------------------------------------------

def stream_once(spark: Any, stores: str, out: Path, checkpoint: Path,
                source: dict[str, str] | None = None) -> None:
    """One run of a streaming query: everything available now, then stop."""
    options = source or {"stores": stores,
                         "journals": "prefix=spark/, name notin (spark/other/x)"}
    df = spark.readStream.format("gazette").options(**options).load()
    query = (df.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
             .start())
    query.awaitTermination(120)
    assert not query.isActive, "the streaming query did not finish in 120 s"
    assert query.exception() is None, query.exception()


async def test_the_stream_resumes_from_its_checkpoint(
        spark: Any, broker_server: BrokerServer, tmp_path: Path) -> None:
    await broker_server.apply_yaml(SPECS)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stores = store_url(broker_server)
    written: dict[str, list[bytes]] = {"spark/lines-gzip": [], "spark/lines-none": []}
    async with JournalClient(broker_server.grpc_address) as client:
        async def write(journal: str, part: bytes) -> None:
            written[journal].append(part)
            await persist(broker_server, client, journal, [part])

        await write("spark/lines-gzip", lines_of("g", 100, 0))
        await run(lambda: stream_once(spark, stores, out, checkpoint))
        # More content, and a journal the stream has not seen: read once each.
        await write("spark/lines-gzip", lines_of("g", 70, 1))
        await write("spark/lines-none", lines_of("n", 30, 0))
        await run(lambda: stream_once(spark, stores, out, checkpoint))
        await run(lambda: stream_once(spark, stores, out, checkpoint))  # nothing new
        await write("spark/lines-gzip", lines_of("g", 5, 2))
        await run(lambda: stream_once(spark, stores, out, checkpoint))
    got = await run(lambda: rows(spark.read.parquet(str(out))))
    assert got == {j: expected_rows(parts) for j, parts in written.items()}


async def test_a_stream_under_a_rate_limit_reads_every_byte_once_across_restarts(
        spark: Any, broker_server: BrokerServer, written: dict[str, list[bytes]],
        tmp_path: Path) -> None:
    """maxBytesPerTrigger: each micro-batch reads about that many bytes, in whole
    fragments, at least one (here: one fragment a batch); a query stopped after two
    batches and restarted from its checkpoint (AvailableNow, which honours the limit too)
    goes on where it ended: every byte once. Each batch's progress reports the journals'
    persisted ends (latestOffset). startingTimestamp starts at the first fragment
    modified since."""
    import time

    lines = {j: written[j] for j in ("spark/lines-gzip", "spark/lines-none")}
    options = {"stores": store_url(broker_server),
               "journals": "name in (spark/lines-gzip, spark/lines-none)",
               "maxBytesPerTrigger": "1"}
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    largest = max(len(p.splitlines()) for parts in lines.values() for p in parts)

    def start(**trigger: Any) -> Any:
        df = spark.readStream.format("gazette").options(**options).load()
        return (df.writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())

    def batches(query: Any) -> list[Any]:
        return [p for p in query.recentProgress if p.numInputRows]

    def some() -> list[Any]:
        query = start(processingTime="0 seconds")
        deadline = time.monotonic() + 120
        while len(batches(query)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the query's progress under a deadline
        query.stop()
        return batches(query)

    def rest() -> list[Any]:
        query = start(availableNow=True)
        query.awaitTermination(180)
        assert not query.isActive and query.exception() is None, query.exception()
        return batches(query)

    first = await run(some)
    second = await run(rest)
    assert len(first) >= 2 and second, (len(first), len(second))
    assert all(b.numInputRows <= largest for b in first + second)  # (a fragment each)
    assert len(first) + len(second) == sum(len(p) for p in lines.values())
    assert await run(lambda: rows(spark.read.parquet(str(out)))) == {
        j: expected_rows(parts) for j, parts in lines.items()}
    reported = json.loads(second[-1].sources[0].latestOffset)
    assert reported == {j: len(b"".join(parts)) for j, parts in lines.items()}

    batch = {k: v for k, v in options.items() if k != "maxBytesPerTrigger"}
    since = spark.read.format("gazette").options(**batch, startingTimestamp="1")
    assert await run(lambda: since.load().count()) == sum(
        len(b"".join(p).splitlines()) for p in lines.values())
    future = spark.read.format("gazette").options(
        **batch, startingTimestamp="2999-01-01T00:00:00Z")
    assert await run(lambda: future.load().count()) == 0
    with pytest.raises(Exception, match=r"maxBytesPerTrigger.*for readStream only"):
        await run(lambda: spark.read.format("gazette").options(**options).load().count())


async def test_a_stream_reads_fragments_persisted_out_of_order_once(
        spark: Any, broker_server: BrokerServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The persister uploads concurrently and retries per fragment: a later fragment can
    be in the store before an earlier one. A stream stops before the range not persisted
    yet (a broker lists it unpersisted; listing stores, the hole is younger than
    holeGraceSeconds) and reads it in a later micro-batch: every byte once, and no
    DataLoss (it was: failOnDataLoss=true failed the batch, false skipped it for ever)."""
    await broker_server.apply_yaml(SPECS)
    journal = "spark/lines-none"
    parts = [lines_of("o", 40 + 10 * i, i) for i in range(3)]
    stores = store_url(broker_server)
    sources = {"broker": {"broker": broker_server.grpc_address, "journals": f"name={journal}"},
               "stores": {"stores": stores, "journals": f"name={journal}"}}

    def stream(name: str) -> None:
        stream_once(spark, "", tmp_path / name / "out", tmp_path / name / "checkpoint",
                    sources[name])

    def streamed(name: str) -> list[tuple[int, str]]:
        return rows(spark.read.parquet(str(tmp_path / name / "out"))).get(journal, [])

    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, journal, parts[:1])
        store = broker_server.broker.store_for("file:///")
        real_put, held_at = store.put, len(parts[0])
        released = asyncio.Event()

        async def put(fragment: Any, source: Any) -> None:
            if fragment.begin == held_at and not released.is_set():
                raise OSError("held by the test: an upload still under way")
            await real_put(fragment, source)

        monkeypatch.setattr(store, "put", put)
        for part in parts[1:]:  # the second fragment is held, the third is persisted
            await client.append(journal, part)
            await broker_server.broker.replicas[journal].roll()
        third = len(parts[0]) + len(parts[1])

        def third_persisted() -> bool:
            return any(f.begin == third for f in
                       broker_server.broker.replicas[journal].fragments()
                       if f.backing_store)

        await eventually(third_persisted, "the third fragment is persisted", timeout=30)
        for name in sources:
            await run(lambda n=name: stream(n))  # type: ignore[misc]
            assert await run(lambda n=name: streamed(n)) == expected_rows(parts[:1]), name
        released.set()
        broker_server.broker.persister.flush(journal)
        await broker_server.broker.persister.wait_idle()
        for name in sources:
            await run(lambda n=name: stream(n))  # type: ignore[misc]
            assert await run(lambda n=name: streamed(n)) == expected_rows(parts), name


async def test_a_reader_schema_is_honoured_or_refused_naming_the_columns(
        spark: Any, broker_server: BrokerServer) -> None:
    await broker_server.apply_yaml(SPECS)
    docs = [JsonMessage(uuid=uuid_text(5, i + 1), n=i) for i in range(3)]
    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, "spark/events",
                      [framing_for("application/x-ndjson").encode(docs)])
    read = spark.read.format("gazette").options(
        stores=store_url(broker_server), journals="name=spark/events", framing="json")
    # Some of the columns, reordered; documents parsed into the schema's data struct.
    df = await run(read.schema("data struct<n: int>, clock bigint, journal string").load)
    got = await run(lambda: df.orderBy("clock").collect())
    assert df.columns == ["data", "clock", "journal"]
    assert [(r["data"]["n"], r["clock"], r["journal"]) for r in got] == [
        (i, (i + 1) << 4, "spark/events") for i in range(3)]
    bad = read.schema("offset bigint, word string")
    with pytest.raises(Exception) as err:
        await run(lambda: bad.load().collect())
    assert "Schema and number of arrays unequal" not in str(err.value)
    assert ("gazette source reader schema: column 'word' is not one the source produces; "
            "framing=json produces journal string, offset bigint, value string, uuid "
            "string") in str(err.value)


async def test_a_bad_option_fails_the_query_at_once_naming_it(spark: Any) -> None:
    bad = spark.read.format("gazette").options(stores="file:///nowhere/", framing="xml")
    with pytest.raises(Exception) as err:
        await run(bad.load)
    assert "gazette source option 'framing'" in str(err.value)


async def test_the_native_path_honours_a_reader_schema_and_refuses_a_bad_plan(
        spark: Any, broker_server: BrokerServer, written: dict[str, list[bytes]]) -> None:
    """`gazette_spark.read` with a reader schema: some columns, reordered, read by the
    JVM; a wrong one is refused as the Python source refuses it. The JVM reader alone,
    without the plan `read` gives it or with a plan that is not one, says so."""
    import gazette_spark
    from gazette_spark import native

    journal = "spark/lines-snappy"
    options = {"stores": store_url(broker_server), "journals": f"name={journal}"}
    df = await run(lambda: gazette_spark.read(spark, "value string, offset bigint",
                                              **options))
    assert df.columns == ["value", "offset"]
    assert "gazette-lines" in df._jdf.queryExecution().analyzed().toString()
    got = await run(lambda: [(r["offset"], r["value"]) for r in df.orderBy("offset")
                             .collect()])
    assert got == expected_rows(written[journal])
    with pytest.raises(Exception, match="column 'offset' is string, not bigint"):
        gazette_spark.read(spark, "offset string", **options)  # (refused before planning)
    in_async = await run(lambda: gazette_spark.read(spark, **options).count())
    assert in_async == len(expected_rows(written[journal]))  # (planned on a loop's thread)
    assert gazette_spark.read(spark, **options).count() == in_async

    def alone(**given: str) -> Any:  # (ADD JAR is for the JVM thread that runs it)
        native.ensure(spark)
        return spark.read.format(native.CLASS).options(**given).load().collect()

    with pytest.raises(Exception, match="option 'slices' \\(the plan\\) is missing"):
        await run(alone)
    with pytest.raises(Exception, match="option 'slices' is not the plan's JSON"):
        await run(lambda: alone(slices="[{"))


async def test_the_native_path_reads_any_line_as_the_python_source_does(
        spark: Any, broker_server: BrokerServer) -> None:
    """Lines of every shape through the JVM's row writer (its rows built by hand in
    Spark's format): empty ones, CRLF, one longer than its first row buffer, multibyte
    UTF-8, a newline at every position of an 8-byte step (its newline search goes eight
    bytes at a time), and a last line without a newline; every column subset."""
    import gazette_spark

    await broker_server.apply_yaml(SPECS)
    lines = [b"", b"crlf\r", b"x" * 5000, "\u00e9t\u00e9 \u2603".encode(), b"", b"end"]
    lines += [b"n" * k for k in range(17)]
    content = b"\n".join(lines) + b"\nno newline at the end"
    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, "spark/lines-none", [content])
    options = {"stores": store_url(broker_server), "journals": "name=spark/lines-none"}
    want, offset = [], 0
    for line in content.split(b"\n"):
        want.append(("spark/lines-none", offset, line.removesuffix(b"\r").decode()))
        offset += len(line) + 1

    def read(schema: str | None) -> list[tuple[Any, ...]]:
        df = gazette_spark.read(spark, schema, **options)
        assert "gazette-lines" in df._jdf.queryExecution().analyzed().toString()
        return [tuple(r) for r in df.collect()]

    assert sorted(await run(lambda: read(None)), key=lambda r: r[1]) == want
    python = spark.read.format("gazette").options(**options).load()
    assert sorted(await run(lambda: [tuple(r) for r in python.collect()]),
                  key=lambda r: r[1]) == want
    assert sorted(await run(lambda: read("offset bigint"))) == [(o,) for _, o, _ in want]
    assert await run(lambda: read("journal string")) == [(j,) for j, _, _ in want]
    assert sorted(await run(lambda: read("value string, offset bigint")),
                  key=lambda r: r[1]) == [(v, o) for _, o, v in want]
