"""The Spark source's pure parts, without a JVM: options, decoders, read-committed and
planning."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from gazette.fragment import Fragment
from gazette.message import (
    JsonMessage,
    Sequencer,
    framing_for,
    read_committed,
    read_uncommitted,
)
from gazette.message.uuid import Flags, build, to_str
from gazette_spark import decode
from gazette_spark.committed import CommittedReader
from gazette_spark.decode import Block, decoder_for
from gazette_spark.options import EARLIEST, LATEST, OptionError, ReadOptions
from gazette_spark.plan import DataLoss, admitted, plan, slices
from gazette_spark.uuids import parse_text_column

# -- options -----------------------------------------------------------------------------


def test_options_parse_with_defaults_and_any_case() -> None:
    o = ReadOptions.parse({"STORES": "file:///a/, s3://bkt/p/", "Journals": "prefix=x/",
                           "startingOffsets": '{"x/a": 5, "x/b": -2}',
                           "readcommitted": "TRUE", "framing": "json",
                           "startTime": "2026-11-24T00:00:00Z"})
    assert o.stores == ("file:///a/", "s3://bkt/p/") and o.read_committed
    assert o.starting.of("x/a") == 5 and o.starting.of("x/b") == EARLIEST
    assert o.starting.of("x/c") == EARLIEST and o.ending.of("x/a") == LATEST
    assert o.start_time == 1795478400


@pytest.mark.parametrize(("options", "field", "reason"), [
    ({}, "broker", "exactly one"),
    ({"broker": "h:1", "stores": "file:///a/"}, "broker", "exactly one"),
    ({"stores": "ftp://x/"}, "stores", "ftp"),
    ({"stores": "file:///a/", "journals": "app=x"}, "journals", "broker="),
    ({"stores": "file:///a/", "journals": "(("}, "journals", ""),
    ({"stores": "file:///a/", "framing": "xml"}, "framing", "lines, json"),
    ({"stores": "file:///a/", "readCommitted": "true"}, "readCommitted", "UUIDs"),
    ({"stores": "file:///a/", "readCommitted": "maybe"}, "readCommitted", "true or false"),
    ({"stores": "file:///a/", "startingOffsets": "latest"}, "startingOffsets", "batch"),
    ({"stores": "file:///a/", "startingOffsets": '{"a": "x"}'}, "startingOffsets", "integer"),
    ({"stores": "file:///a/", "endingOffsets": "earliest"}, "endingOffsets", "earliest"),
    ({"stores": "file:///a/", "minPartitions": "-1"}, "minPartitions", "outside"),
    ({"stores": "file:///a/", "startTime": "yesterday"}, "startTime", "ISO 8601"),
    ({"stores": "file:///a/", "schema": "a int"}, "schema", "json"),
    ({"stores": "file:///a/", "framing": "fixed", "messageType": "nocolon"},
     "messageType", "module:attribute"),
    ({"stores": "file:///a/", "typo": "1"}, "typo", "unknown option"),
    ({"stores": "file:///a/", "maxBytesPerTrigger": "1024"}, "maxBytesPerTrigger",
     "readStream only"),
    ({"stores": "file:///a/", "startingTimestamp": "soon"}, "startingTimestamp",
     "ISO 8601"),
    ({"stores": "file:///a/", "startingTimestamp": "-5"}, "startingTimestamp",
     "positive number of milliseconds"),
    ({"stores": "file:///a/", "startingTimestamp": "5", "startingOffsets": "earliest"},
     "startingTimestamp", "not both"),
])
def test_bad_options_are_refused_naming_them(options: dict[str, str], field: str,
                                             reason: str) -> None:
    with pytest.raises(OptionError) as err:
        ReadOptions.parse(options)
    assert f"'{field}'" in str(err.value) and reason in str(err.value)


def test_streams_refuse_what_only_batches_do() -> None:
    with pytest.raises(OptionError, match="endingOffsets"):
        ReadOptions.parse({"stores": "file:///a/", "endingOffsets": "latest"},
                          streaming=True)
    assert ReadOptions.parse({"stores": "file:///a/", "readCommitted": "true",
                              "framing": "json"}, streaming=True).read_committed
    assert ReadOptions.parse({"stores": "file:///a/", "startingOffsets": "latest"},
                             streaming=True).starting.default == LATEST


def test_stream_limits_and_a_starting_timestamp_parse() -> None:
    o = ReadOptions.parse({"stores": "file:///a/", "maxBytesPerTrigger": "4096",
                           "maxOffsetsPerTrigger": "1000",
                           "startingTimestamp": "2026-11-24T00:00:00Z"}, streaming=True)
    assert o.max_bytes_per_trigger == 1000  # (offsets are bytes: the smaller of both)
    assert o.starting_timestamp_ms == 1795478400_000
    assert ReadOptions.parse({"stores": "file:///a/", "startingTimestamp": "1700000000123"}
                             ).starting_timestamp_ms == 1700000000123
    either = ReadOptions.parse({"stores": "file:///a/", "maxBytesPerTrigger": "9"},
                               streaming=None)  # (a source's schema: either mode)
    assert either.max_bytes_per_trigger == 9


def _struct(*fields: tuple[str, Any]) -> Any:
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(name, kind) for name, kind in fields])


def test_a_reader_schema_of_produced_columns_is_honoured_else_refused() -> None:
    from pyspark.sql.types import IntegerType, LongType, StringType

    from gazette_spark.source import SchemaError, check_schema

    json_opts = ReadOptions.parse({"stores": "file:///a/", "framing": "json"})
    lines_opts = ReadOptions.parse({"stores": "file:///a/"})
    # A subset, reordered; data is any struct the documents are parsed into.
    check_schema(_struct(("clock", LongType()), ("value", StringType()),
                         ("data", _struct(("n", IntegerType())))), json_opts)
    check_schema(_struct(("offset", LongType())), lines_opts)
    for schema, opts, said in [
        (_struct(("foo", StringType())), json_opts, "column 'foo' is not one"),
        (_struct(("uuid", StringType())), lines_opts, "column 'uuid' is not one"),
        (_struct(("offset", IntegerType())), lines_opts, "'offset' is int, not bigint"),
        (_struct(("data", _struct(("n", IntegerType())))), lines_opts, "framing=json"),
        (_struct(("data", StringType())), json_opts, "not a struct"),
        (_struct(("value", StringType()), ("value", StringType())), lines_opts, "twice"),
        (_struct(), lines_opts, "no columns"),
    ]:
        with pytest.raises(SchemaError) as err:
            check_schema(schema, opts)
        assert said in str(err.value) and "reader schema" in str(err.value)
        assert f"framing={opts.framing} produces journal string, offset bigint" in str(
            err.value)


def test_audit_reports_a_journal_without_fragments() -> None:
    from gazette_spark.audit import offsets_report

    assert offsets_report([]) == {"fragments": 0, "bytes": 0, "begin": None, "end": None,
                                  "holes": [], "pending": [], "overlaps": []}


def test_audit_tells_a_pending_upload_from_a_hole() -> None:
    from gazette_spark.audit import offsets_report

    stored = [frag("a/x", 0, 10), frag("a/x", 20, 30), frag("a/x", 40, 50)]
    # A broker lists [10, 20) unpersisted (its upload under way): pending, no hole.
    report = offsets_report(stored, [frag("a/x", 10, 20, "")])
    assert (report["holes"], report["pending"]) == ([[30, 40]], [[10, 20]])


# -- decoders ----------------------------------------------------------------------------

def decode_all(framing: str, data: bytes, chunk: int, **kw: Any) -> list[Block]:
    d = decoder_for("j/x", framing, **kw)
    out: list[Block] = []
    for i in range(0, len(data), chunk):
        out += d.feed(data[i:i + chunk], 100 + i)
    return out + d.finish()


def test_lines_are_found_across_any_chunking() -> None:
    text = b"a\r\nbb\n\nccc\nno newline"
    want = [(100, "a"), (103, "bb"), (106, ""), (107, "ccc"), (111, "no newline")]
    for chunk in (1, 2, 5, 100):
        got = [(o, v) for b in decode_all("lines", text, chunk)
               for o, v in zip(b.begins.tolist(), b.values.to_pylist(), strict=True)]
        assert got == want, chunk


def uuid_text(producer: int, clock: int, flags: Flags = Flags.OUTSIDE_TXN) -> str:
    return to_str(build(producer, clock << 4, flags))


def test_json_fast_and_slow_paths_agree_with_the_library() -> None:
    docs = [{"uuid": uuid_text(3, i + 1), "n": i} for i in range(50)]
    clean = b"".join(json.dumps(d).encode() + b"\n" for d in docs)
    messy = clean + b"   \n[1]\n" + json.dumps({"uuid": "{" + docs[0]["uuid"] + "}",
                                                "n": 99}).encode() + b"\n"
    for data in (clean, messy):
        frames, _ = framing_for("application/x-ndjson").decode(data, final=True)
        want = [(100 + f.begin, f.message.get_uuid()) for f in frames if f.error is None]
        blocks = decode_all("json", data, 7)
        got = [(o, int(u.replace("-", ""), 16) if u else None) for b in blocks
               for o, u in zip(b.begins.tolist(), b.uuid_text.to_pylist(), strict=True)]
        assert got == want


def test_uuid_columns_match_the_library_or_decline() -> None:
    import pyarrow as pa

    texts = [uuid_text(0xABCDEF, 12345, Flags.ACK_TXN), None, ""]
    cols = parse_text_column(pa.array(texts, pa.string()))
    assert cols is not None
    assert cols.has.tolist() == [True, False, False]
    assert int(cols.producer[0]) == 0xABCDEF and int(cols.clock[0]) == 12345 << 4
    assert int(cols.flags[0]) == Flags.ACK_TXN
    v4 = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
    assert parse_text_column(pa.array([v4])) is None
    assert parse_text_column(pa.array([texts[0].upper()])) is not None
    assert parse_text_column(pa.array(["zz" + texts[0][2:]])) is None
    assert parse_text_column(pa.array([texts[0][:34] + " a"])) is None
    assert parse_text_column(pa.array([texts[0][:9] + "-" + texts[0][10:]])) is None


# -- read-committed ------------------------------------------------------------------------

def random_stream(seed: int) -> bytes:
    """Appends of producers mixing committed publishing, transactions, re-sent appends,
    roll-backs and ACK re-writes."""
    rnd = random.Random(seed)
    enc = framing_for("application/x-ndjson")
    clocks = {p: 0 for p in range(1, 5)}
    out = []
    for _ in range(300):
        p = rnd.randint(1, 4)
        kind = rnd.random()
        if kind < 0.4:
            batch = []
            for _ in range(rnd.randint(1, 20)):
                clocks[p] += 1
                batch.append(JsonMessage(uuid=uuid_text(p, clocks[p]), n=clocks[p]))
        elif kind < 0.7:
            batch = []
            for _ in range(rnd.randint(1, 5)):
                clocks[p] += 1
                batch.append(JsonMessage(uuid=uuid_text(p, clocks[p], Flags.CONTINUE_TXN),
                                         n=clocks[p]))
        elif kind < 0.9:
            clocks[p] += rnd.choice([0, 1])
            batch = [JsonMessage(uuid=uuid_text(p, clocks[p], Flags.ACK_TXN))]
        else:
            batch = [JsonMessage(n=-1)]
        data = enc.encode(batch)
        out.append(data)
        if rnd.random() < 0.1:
            out.append(data)  # re-sent
    return b"".join(out)


async def library(content: bytes) -> list[int]:
    framing = framing_for("application/x-ndjson")

    async def chunks(data: bytes) -> AsyncIterator[bytes]:
        yield data

    async def replay(_: str, begin: int, end: int) -> AsyncIterator[list[Any]]:
        async for b in read_uncommitted("j/x", chunks(content[begin:end]), framing, begin):
            yield b

    return [env.begin async for batch in read_committed(
        read_uncommitted("j/x", chunks(content), framing), Sequencer(), replay)
        for env in batch]


@pytest.mark.parametrize("seed", range(6))
def test_committed_reader_equals_the_library_reader(seed: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    content = random_stream(seed)
    want = asyncio.run(library(content))

    def blocks(begin: int, end: int) -> list[Block]:
        d = decoder_for("j/x", "json")
        return d.feed(content[begin:end], begin) + d.finish()

    for block_size in (256, 4096, 1 << 20):  # blocks split anywhere between messages
        monkeypatch.setattr(decode, "BLOCK", block_size)
        reader = CommittedReader("j/x", lambda b, e: iter(blocks(b, e)))
        d = decoder_for("j/x", "json")
        fed = [b for i in range(0, len(content), 1000)
               for b in d.feed(content[i:i + 1000], i)] + d.finish()
        got: list[int] = []
        for block in fed:
            out = reader.feed(block)
            got += block.begins[out].tolist() if isinstance(out, np.ndarray) else [
                r["offset"] for r in out]
        assert got == want, block_size
        assert reader.slow_blocks


def test_committed_publishing_takes_the_vectorized_path() -> None:
    enc = framing_for("application/x-ndjson")
    first = enc.encode([JsonMessage(uuid=uuid_text(1, c), n=c) for c in range(1, 100)])
    resent = enc.encode([JsonMessage(uuid=uuid_text(1, c), n=c) for c in range(50, 120)])
    content = first + resent
    d = decoder_for("j/x", "json")
    [block] = d.feed(content, 0) + d.finish()
    reader = CommittedReader("j/x", lambda b, e: iter(()))
    out = reader.feed(block)
    assert isinstance(out, np.ndarray) and reader.fast_blocks == 1 and not reader.slow_blocks
    assert block.begins[out].tolist() == asyncio.run(library(content))
    assert reader.sequencer.duplicates == 50


# -- planning ------------------------------------------------------------------------------

def frag(journal: str, begin: int, end: int, store: str = "file:///s/",
         mod_time: int = 0) -> Fragment:
    return Fragment(journal, begin, end, hashlib.sha1(b"%d" % begin).digest(),
                    backing_store=store, mod_time=mod_time)


def test_cover_sets_holes_offsets_and_partitions() -> None:
    found = {"a/x": [(frag("a/x", 0, 100), ""), (frag("a/x", 0, 100, "file:///t/"), ""),
                     (frag("a/x", 100, 250), ""), (frag("a/x", 50, 150), "")],
             "a/y": [(frag("a/y", 10, 20), ""), (frag("a/y", 30, 40), "")]}
    opts = ReadOptions.parse({"stores": "file:///s/", "failOnDataLoss": "false",
                              "maxPartitionBytes": "1024"})
    p = plan(found, opts)
    assert [(x.begin, x.end) for x in p.pieces["a/x"]] == [(0, 100), (100, 250)]
    assert [(x.begin, x.end) for x in p.pieces["a/y"]] == [(10, 20), (30, 40)]
    with pytest.raises(DataLoss, match=r"a/y: bytes \[20, 30\)"):
        plan(found, ReadOptions.parse({"stores": "file:///s/"}))
    ranged = ReadOptions.parse({"stores": "file:///s/", "startingOffsets": '{"a/x": 120}',
                                "endingOffsets": '{"a/x": 200}', "journals": "name=a/x"})
    p2 = plan({"a/x": found["a/x"]}, ranged)
    assert [(x.begin, x.end) for x in p2.pieces["a/x"]] == [(120, 200)]
    with pytest.raises(DataLoss, match="before the journal's first fragment"):
        plan({"a/y": found["a/y"]}, ReadOptions.parse(
            {"stores": "file:///s/", "startingOffsets": '{"a/y": 0}'}))
    assert len(slices(p, opts)) == 2  # one per journal: each under maxPartitionBytes


def test_a_micro_batch_admits_whole_fragments_in_turn_within_its_budget() -> None:
    found = {"a/x": [(frag("a/x", 0, 100), ""), (frag("a/x", 100, 250), ""),
                     (frag("a/x", 250, 260), "")],
             "a/y": [(frag("a/y", 0, 40), ""), (frag("a/y", 40, 80), "")]}
    opts = ReadOptions.parse({"stores": "file:///s/"})
    p = plan(found, opts)
    assert admitted(p, {}, 1) == {"a/x": 100, "a/y": 0}  # (one fragment at least)
    assert admitted(p, {}, 140) == {"a/x": 100, "a/y": 40}  # (a fragment each in turn)
    assert admitted(p, {}, 300) == {"a/x": 250, "a/y": 40}  # (y's next: over it)
    assert admitted(p, {}, 330) == {"a/x": 250, "a/y": 80}
    assert admitted(p, {}, 10_000) == {"a/x": 260, "a/y": 80}
    later = plan(found, opts, {"a/x": 250, "a/y": 80})
    assert admitted(later, {"a/x": 250, "a/y": 80}, 1) == {"a/x": 260, "a/y": 80}
    stamped = {"a/x": [(frag("a/x", 0, 100, mod_time=10), ""),
                       (frag("a/x", 100, 250, mod_time=30), "")]}
    since = ReadOptions.parse({"stores": "file:///s/", "startingTimestamp": "20000"})
    assert [(x.begin, x.end) for x in plan(stamped, since).pieces["a/x"]] == [(100, 250)]


def test_ranges_not_persisted_yet_stop_a_read_and_are_no_loss() -> None:
    # Through a broker: it lists [100, 200) unpersisted while [200, 300) is in a store.
    listed = {"a/x": [(frag("a/x", 0, 100), ""), (frag("a/x", 100, 200, ""), ""),
                      (frag("a/x", 200, 300), "")]}
    broker = ReadOptions.parse({"broker": "localhost:8080"})
    p = plan(listed, broker)
    assert [(x.begin, x.end) for x in p.pieces["a/x"]] == [(0, 100)]
    assert p.ends["a/x"] == 100  # a stream reads on from here once it is persisted
    # A journal's first fragment not persisted yet: nothing is read, from 0.
    first = plan({"a/y": [(frag("a/y", 0, 10, ""), ""), (frag("a/y", 10, 20), "")]}, broker)
    assert first.pieces["a/y"] == [] and (first.starts["a/y"], first.ends["a/y"]) == (0, 0)
    # Listing stores: a hole before a fragment persisted moments ago may be an upload
    # under way; before one older than holeGraceSeconds, it is lost.
    young = replace(frag("a/z", 20, 30), mod_time=int(time.time()))
    hole = {"a/z": [(frag("a/z", 0, 10), ""), (young, "")]}
    stores = ReadOptions.parse({"stores": "file:///s/"})
    assert [(x.begin, x.end) for x in plan(hole, stores).pieces["a/z"]] == [(0, 10)]
    with pytest.raises(DataLoss, match=r"a/z: bytes \[10, 20\)"):
        plan(hole, ReadOptions.parse({"stores": "file:///s/", "holeGraceSeconds": "0"}))
    with pytest.raises(OptionError, match="holeGraceSeconds"):
        ReadOptions.parse({"stores": "file:///s/", "holeGraceSeconds": "-1"})


def test_large_uncompressed_fragments_are_split_for_line_framings() -> None:
    opts = ReadOptions.parse({"stores": "file:///s/", "maxPartitionBytes": "1024"})
    big = plan({"a/x": [(frag("a/x", 0, 10_000), "")]}, opts)
    parts = slices(big, opts)
    assert len(parts) == 10
    spans = [(s.pieces[0].begin, s.pieces[0].end) for s in parts]
    assert spans[0] == (0, 1000) and spans[-1][1] == 10_000
    assert [s.pieces[0].head_cut for s in parts] == [False] + [True] * 9
    csv = ReadOptions.parse({"stores": "file:///s/", "maxPartitionBytes": "1024",
                             "framing": "csv"})
    assert len(slices(plan({"a/x": [(frag("a/x", 0, 10_000), "")]}, csv), csv)) == 1
    rc = ReadOptions.parse({"stores": "file:///s/", "framing": "json",
                            "readCommitted": "true", "minPartitions": "50"})
    assert len(slices(plan({"a/x": [(frag("a/x", 0, 10_000), "")]}, rc), rc)) == 1


# -- split parts ---------------------------------------------------------------------------

@pytest.mark.parametrize("target", [1, 3, 10, 64, 1000])
def test_split_parts_own_each_line_once(target: int, tmp_path: Any) -> None:
    from pathlib import Path

    from gazette.fragment.store import FileStore
    from gazette_spark.slices import SliceReader

    lines = [b"x" * n for n in (0, 1, 2, 30, 0, 5, 100, 1, 0, 7)]
    content = b"".join(line + b"\n" for line in lines) + b"tail"
    f = Fragment("a/x", 1000, 1000 + len(content), hashlib.sha1(content).digest(),
                 backing_store=Path(tmp_path).as_uri() + "/")
    asyncio.run(FileStore("file:///", Path(tmp_path)).put(f, content))
    opts = ReadOptions.parse({"stores": f.backing_store, "maxPartitionBytes": "1024"})
    the_plan = plan({"a/x": [(f, "")]}, opts)
    import pyarrow as pa

    schema = pa.schema([("journal", pa.string()), ("offset", pa.int64()),
                        ("value", pa.string())])
    from dataclasses import replace as dc_replace

    from gazette_spark import plan as planning
    parts = planning._split(the_plan.pieces["a/x"][0], target)
    got = []
    for part in parts:
        reader = SliceReader(planning.Slice("a/x", (part,)), dc_replace(opts), schema)
        for batch in reader.batches():
            got += list(zip(batch.column("offset").to_pylist(),
                            batch.column("value").to_pylist(), strict=True))
    want, offset = [], 1000
    for line in [*lines, b"tail"]:
        want.append((offset, line.decode()))
        offset += len(line) + 1
    assert got == want


# -- stream offsets ----------------------------------------------------------------------

def test_stream_offsets_keep_producer_states_read_committed_and_refuse_others() -> None:
    from gazette_spark.stream_state import OffsetError, encode, ends_of, states_of

    states = {"a/b": ((7, 1 << 60, 100, 0), (9, 5, -1, 6))}
    committed = encode({"a/b": 120, "a/c": 0}, states, committed=True)
    assert json.loads(json.dumps(committed)) == committed
    assert ends_of(committed) == {"a/b": 120, "a/c": 0}
    assert states_of(committed) == {**states, "a/c": ()}
    plain = encode({"a/b": 120}, states, committed=False)
    assert plain == {"a/b": 120} and states_of(plain) == {"a/b": ()}
    for bad, reason in [({"a": -1}, "neither"), ({"a": "12"}, "neither"),
                        ({"a": {"producers": []}}, "neither"), ({"a": True}, "neither"),
                        ({"a": {"end": 1, "producers": [[1, 2, 3]]}}, "lists of integers"),
                        ({"a": {"end": 1, "producers": "x"}}, "lists of integers")]:
        with pytest.raises(OffsetError, match=reason) as err:
            states_of(bad) if reason != "neither" else ends_of(bad)
        assert "stream offset of 'a'" in str(err.value)
