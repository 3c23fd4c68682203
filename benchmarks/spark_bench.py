"""The ``gazette`` PySpark source against Spark's own text source, in local mode.

Fragments are written straight into a temporary ``file://`` store with the library (no
broker): journals of ~100-byte text lines, the same content three times (codecs NONE,
SNAPPY, ZSTANDARD), and ndjson journals of messages with Gazette UUIDs (a few producers,
every message OUTSIDE_TXN, ~1 % re-sent duplicates) for ``readCommitted``. A SparkSession
``local[2]`` reads them. Every figure is a full scan that forces each row through Spark
(``df.write.format("noop")``), timed from ``load()`` to the end of the job, after a
warm-up (a ``count()``, checked against the rows written, and one untimed scan); the
median of ``--runs`` (default 3), the sides of a comparison alternating (the Python
sources apart from the JVM's). ``--action sum-length`` times
``selectExpr("sum(length(value))").collect()`` instead, on both sides.

Prints progress and a table on stderr, then one JSON object as its last line:

- ``rows_per_s`` / ``mb_per_s``: ``format("gazette")`` over the uncompressed journals
  (``framing=lines``), rows and content MB (10^6 bytes) per second;
- ``text_rows_per_s``: ``spark.read.text`` over the very same ``.raw`` fragment files
  (plain text), the ceiling; ``vs_text``: ``rows_per_s / text_rows_per_s``;
- ``python_source_ceiling_rows_per_s``: a Python data source that does no work (one
  batch of the same rows' shape, built once per partition and yielded again and again,
  as many rows as the uncompressed files hold): what Spark's hand-over of Arrow batches
  from a Python worker costs, the most any Python source gets here;
  ``ceiling_vs_text`` (its rows/s over text's) and ``vs_ceiling`` (``rows_per_s`` over
  its);
- ``snappy_rows_per_s``, ``snappy_mb_per_s``, ``snappy_vs_text`` and the ``zstd_`` ones:
  the same content in SNAPPY and ZSTANDARD fragments, against the same text baseline;
- ``json_rows_per_s``: ``framing=json`` over the ndjson journals, messages per second;
  ``json_read_committed_rows_per_s``: the same with ``readCommitted=true`` (messages read
  per second: the ~1 % duplicates it drops count as read); ``read_committed_cost``:
  ``1 - json_read_committed_rows_per_s / json_rows_per_s``;
- ``rows``, ``mb``: one lines data set's rows and content MB; ``json_rows``,
  ``json_mb``, ``json_committed_rows``; ``cores``; ``runs``; ``action``; ``targets``.

Run: ``.venv/bin/python benchmarks/spark_bench.py [--mb 512] [--json-mb 128]`` (about
2 minutes on this 2-core machine when it is quiet, 20 s of it writing the fragments). The driver,
the JVM and the Python workers share the machine's cores; Spark's console progress bar
is off, its warnings go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gazette.fragment import Fragment, compress
from gazette.fragment.store import FileStore
from gazette.message import Clock, Flags
from gazette.message import uuid as uuids
from gazette.protocol import CompressionCodec

MiB = 1 << 20
CODECS = {"none": CompressionCodec.NONE, "gzip": CompressionCodec.GZIP,
          "snappy": CompressionCodec.SNAPPY, "zstd": CompressionCodec.ZSTANDARD}
TARGETS = {"vs_text": 0.8, "gzip_vs_text": 0.8, "json_read_committed_vs_read_json": 0.5}
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu",
         "gazette", "journal", "fragment", "broker", "spark", "offset"]
PRODUCERS = 4
#: Every DUP_EVERY messages of a journal, the last DUP_RANGE are sent again (~1 %).
DUP_EVERY, DUP_RANGE = 10_000, 100


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the data -----------------------------------------------------------------------------


def line_pool(rng: random.Random, n: int = 8192) -> list[bytes]:
    """Distinct line tails of 70-100 bytes (random words), so lines differ and compress
    as text does, not as one repeated line."""
    pool = []
    for _ in range(n):
        want = rng.randint(70, 100)
        words: list[str] = []
        size = 0
        while size < want:
            w = rng.choice(WORDS)
            words.append(w)
            size += len(w) + 1
        pool.append(" ".join(words).encode()[:want])
    return pool


def text_fragments(journal: str, rng: random.Random, pool: list[bytes], volume: int,
                   fragment_size: int) -> Iterator[bytes]:
    """Content of `journal`'s fragments, ~`fragment_size` each, `volume` in all: lines
    ``<journal> <number> <words>`` of ~100 bytes."""
    name = journal.encode()
    i = written = 0
    while written < volume:
        lines = []
        size = 0
        target = min(fragment_size, volume - written)
        while size < target:
            tails = rng.choices(pool, k=4096)
            chunk = b"".join(b"%s %09d %s\n" % (name, i + k, t) for k, t in enumerate(tails))
            i += len(tails)
            lines.append(chunk)
            size += len(chunk)
        content = b"".join(lines)
        written += len(content)
        yield content


def json_fragments(journal: str, rng: random.Random, volume: int, fragment_size: int,
                   seed: int) -> Iterator[tuple[bytes, int, int]]:
    """Content of an ndjson journal's fragments: (content, messages, duplicates). Each
    line ``{"uuid": ..., "word": ..., "n": ...}`` from one of PRODUCERS producers
    (strictly increasing clocks each, OUTSIDE_TXN); every DUP_EVERY messages the last
    DUP_RANGE lines are written again (a re-sent range the Sequencer drops)."""
    producers = [(seed << 8 | p) | (1 << 40) for p in range(PRODUCERS)]
    clocks = [Clock(Clock.from_unix(1.7e9 + p)) for p in range(PRODUCERS)]
    outside = int(Flags.OUTSIDE_TXN)
    recent: list[bytes] = []
    n = written = 0
    while written < volume:
        lines: list[bytes] = []
        size = msgs = dups = 0
        target = min(fragment_size, volume - written)
        while size < target:
            p = rng.randrange(PRODUCERS)
            u = uuids.build(producers[p], clocks[p].tick(), outside)
            line = f'{{"uuid": "{uuids.to_str(u)}", "word": "{rng.choice(WORDS)}", "n": {n}}}\n' \
                .encode()
            n += 1
            lines.append(line)
            size += len(line)
            msgs += 1
            if n % DUP_EVERY == 0:
                again = lines[-DUP_RANGE:] if len(lines) >= DUP_RANGE else recent
                lines.extend(again)
                size += sum(map(len, again))
                msgs += len(again)
                dups += len(again)
        recent = lines[-DUP_RANGE:]
        content = b"".join(lines)
        written += len(content)
        yield content, msgs, dups


async def put(store: FileStore, journal: str, begin: int, content: bytes,
              codec: CompressionCodec) -> Fragment:
    f = Fragment(journal, begin, begin + len(content), hashlib.sha1(content).digest(), codec)
    await store.put(f, await asyncio.to_thread(compress, codec, content))
    return f


async def write_data(root: Path, mb: int, json_mb: int, journals: int,
                     fragment_size: int) -> dict[str, Any]:
    """Writes every data set under `root` (a ``file:///`` store whose file root it is);
    returns their sizes and row counts, and the paths of the uncompressed files."""
    store = FileStore(url="file:///", file_root=root)
    rng = random.Random(20261124)
    pool = line_pool(rng)
    out: dict[str, Any] = {"rows": 0, "bytes": 0, "raw_files": [], "json_rows": 0,
                           "json_bytes": 0, "json_dups": 0, "json_files": [], "gz_files": []}
    per_journal = mb * MiB // journals
    for j in range(journals):
        offset = 0
        for content in text_fragments(f"bench/lines/{j}", rng, pool, per_journal,
                                      fragment_size):
            # The same content in each codec's journals (their own names and folders).
            frags = await asyncio.gather(*(
                put(store, f"bench/lines-{name}/{j}", offset, content, codec)
                for name, codec in CODECS.items()))
            lines = content.count(b"\n")
            out["raw_files"].append((str(store.path_of(frags[0])), lines))
            out["gz_files"].append(str(store.path_of(frags[1])))
            out["rows"] += lines
            out["bytes"] += len(content)
            offset += len(content)
        log(f"  lines journal {j}: {offset / MiB:.0f} MiB in each of "
            f"{', '.join(CODECS)}")
    per_journal = json_mb * MiB // journals
    for j in range(journals):
        offset = 0
        for content, msgs, dups in json_fragments(f"bench/json/{j}", rng, per_journal,
                                                  fragment_size, j + 1):
            f = await put(store, f"bench/json/{j}", offset, content, CompressionCodec.NONE)
            out["json_files"].append(str(store.path_of(f)))
            out["json_rows"] += msgs
            out["json_dups"] += dups
            out["json_bytes"] += len(content)
            offset += len(content)
        log(f"  json journal {j}: {offset / MiB:.0f} MiB")
    return out


# -- Spark --------------------------------------------------------------------------------


def ceiling_source() -> type:
    """A Python data source that does no work: each partition takes the lines of the
    first 8 MiB of one ``.raw`` file once, as ``(journal, offset, value)`` like the
    ``gazette`` source's rows, and yields that batch again and again until it has given
    as many rows as the file holds. What Spark itself costs a Python source's rows (the
    Arrow hand-over from the worker, the JVM's rows), the ceiling of any such source."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class CeilingReader(DataSourceReader):
        def __init__(self, files: list[tuple[str, int]]) -> None:
            self.files = files

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(f) for f in self.files]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import numpy as np
            import pyarrow as pa

            path, rows = partition.value
            with open(path, "rb") as fh:
                block = fh.read(8 * MiB)
            lines = block[:block.rfind(b"\n")].split(b"\n")
            n = len(lines)
            offsets = np.zeros(n, dtype=np.int64)
            np.cumsum([len(x) + 1 for x in lines[:-1]], out=offsets[1:])
            batch = pa.RecordBatch.from_arrays(
                [pa.repeat(pa.scalar(Path(path).parent.name), n), pa.array(offsets),
                 pa.array(lines, pa.binary()).cast(pa.string())],
                names=["journal", "offset", "value"])
            while rows > 0:
                yield batch if rows >= n else batch.slice(0, rows)
                rows -= n

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "gazette_bench_ceiling"

        def schema(self) -> str:
            return "journal string, offset bigint, value string"

        def reader(self, schema: Any) -> DataSourceReader:
            return CeilingReader(json.loads(self.options["files"]))

    return CeilingSource



def start_spark(tmp: Path) -> Any:
    """A local SparkSession, two cores, with the ``gazette`` source registered."""
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import gazette_spark
    from gazette_spark.native import with_native

    session = (with_native(SparkSession.builder).master("local[2]")
               .appName("gazette-spark-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.local.dir", str(tmp / "spark-local"))
               .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
               .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={tmp}")
               .getOrCreate())
    session.sparkContext.setLogLevel("WARN")
    gazette_spark.register(session)
    session.dataSource.register(ceiling_source())
    return session


def scan(load: Callable[[], Any], action: str) -> float:
    """Seconds to load a DataFrame and push every row through Spark: into the noop sink,
    or (``sum-length``) summing the length of every value."""
    start = time.perf_counter()
    df = load()
    if action == "noop":
        df.write.format("noop").mode("overwrite").save()
    else:
        df.selectExpr("sum(length(value))").collect()
    return time.perf_counter() - start


def compare(sides: dict[str, Callable[[], Any]], want: dict[str, int], runs: int,
            action: str) -> dict[str, float]:
    """Median seconds of each side's full scan: a warm-up each (a ``count()``, checked
    against `want`, and one untimed scan: the JIT compiles the path the timed scans
    take, not a count's), then `runs` rounds, the sides alternating."""
    for name, load in sides.items():
        start = time.perf_counter()
        got = load().count()
        scan(load, action)
        log(f"  warm-up {name}: {got} rows, a count and a scan in "
            f"{time.perf_counter() - start:.1f}s")
        if got != want[name]:
            raise SystemExit(f"{name}: read {got} rows, expected {want[name]}")
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(runs):
        for name, load in sides.items():
            times[name].append(scan(load, action))
    for name, ts in times.items():
        log(f"  {name}: " + ", ".join(f"{t:.2f}" for t in ts) + " s")
    return {name: statistics.median(ts) for name, ts in times.items()}


def run(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    log(f"writing fragments under {tmp} ({args.journals} journals per data set, "
        f"~{args.fragment_mb} MiB fragments)")
    start = time.perf_counter()
    data = asyncio.run(write_data(tmp, args.mb, args.json_mb, args.journals,
                                  args.fragment_mb * MiB))
    log(f"wrote the data in {time.perf_counter() - start:.1f}s")
    rows, size = data["rows"], data["bytes"]
    json_rows, json_size = data["json_rows"], data["json_bytes"]
    committed = json_rows - data["json_dups"]
    stores = tmp.as_uri() + "/"

    import gazette_spark

    spark = start_spark(tmp)
    try:
        def gazette(journals: str, **options: str) -> Callable[[], Any]:
            return lambda: spark.read.format("gazette").options(
                stores=stores, journals=journals, **options).load()

        def text() -> Any:
            return spark.read.text([path for path, _ in data["raw_files"]])

        def text_gz() -> Any:  # (the same .gz files: Spark's text source decompresses)
            return spark.read.text(data["gz_files"])

        def ceiling() -> Any:
            return spark.read.format("gazette_bench_ceiling").option(
                "files", json.dumps(data["raw_files"])).load()

        def native(journals: str) -> Callable[[], Any]:
            return lambda: gazette_spark.read(spark, stores=stores, journals=journals)

        def read_json() -> Any:  # (given the schema: no inference pass)
            return spark.read.schema("uuid string, word string, n bigint").json(
                data["json_files"])

        secs: dict[str, float] = {}
        for name in CODECS:
            log(f"lines, {name}: gazette_spark.read (the JVM's native path) against "
                "spark.read.text" + (", the Python source, and a Python source that does "
                                     "no work:" if name == "none" else ":"))
            sides = {f"native/{name}": native(f"prefix=bench/lines-{name}/"),
                     f"text/{name}": text}
            if name == "gzip":
                sides["text_gz"] = text_gz
            secs.update(compare(sides, dict.fromkeys(sides, rows), args.runs, args.action))
            if name == "none":  # (apart: a Python worker's scan leaves the JVM garbage
                # and the machine busy, which the scan after it paid for)
                python = {"python/none": gazette(f"prefix=bench/lines-{name}/"),
                          "ceiling": ceiling}
                secs.update(compare(python, dict.fromkeys(python, rows), args.runs,
                                    args.action))
        log("json: the Python source, readCommitted false and true, and spark.read.json:")
        secs.update(compare(
            {"json": gazette("prefix=bench/json/", framing="json"),
             "json_rc": gazette("prefix=bench/json/", framing="json",
                                readCommitted="true"),
             "read_json": read_json},
            {"json": json_rows, "json_rc": committed, "read_json": json_rows}, args.runs,
            args.action))
    finally:
        spark.stop()

    # The text baseline was measured next to each codec: its median over all of them.
    text_s = statistics.median(secs[f"text/{n}"] for n in CODECS)
    text_rows_per_s = rows / text_s
    out: dict[str, Any] = {}
    for name in CODECS:
        prefix = "" if name == "none" else f"{name}_"
        native_s = secs[f"native/{name}"]
        out[f"{prefix}rows_per_s"] = round(rows / native_s)
        out[f"{prefix}mb_per_s"] = round(size / native_s / 1e6, 1)
        out[f"{prefix}vs_text"] = round(
            (secs["text_gz"] if name == "gzip" else text_s) / native_s, 3)
    out["text_gz_rows_per_s"] = round(rows / secs["text_gz"])
    out["text_rows_per_s"] = round(text_rows_per_s)
    out["text_mb_per_s"] = round(size / text_s / 1e6, 1)
    out["python_source_rows_per_s"] = round(rows / secs["python/none"])
    out["python_source_vs_text"] = round(text_s / secs["python/none"], 3)
    out["python_source_ceiling_rows_per_s"] = round(rows / secs["ceiling"])
    out["ceiling_vs_text"] = round(text_s / secs["ceiling"], 3)
    out["json_rows_per_s"] = round(json_rows / secs["json"])
    out["json_mb_per_s"] = round(json_size / secs["json"] / 1e6, 1)
    out["json_read_committed_rows_per_s"] = round(json_rows / secs["json_rc"])
    out["read_committed_cost"] = round(1 - secs["json"] / secs["json_rc"], 3)
    out["read_json_rows_per_s"] = round(json_rows / secs["read_json"])
    out["json_read_committed_vs_read_json"] = round(secs["read_json"] / secs["json_rc"], 3)
    out.update(rows=rows, mb=round(size / 1e6), json_rows=json_rows,
               json_committed_rows=committed, json_mb=round(json_size / 1e6),
               cores=os.cpu_count(), runs=args.runs, action=args.action, targets=TARGETS)

    table = [("source", "rows/s", "MB/s", "vs text / cost")]
    table.append(("spark.read.text (.raw files)", f"{text_rows_per_s:,.0f}",
                  f"{out['text_mb_per_s']}", "1.000"))
    table.append(("spark.read.text (the .gz files)", f"{out['text_gz_rows_per_s']:,}",
                  f"{size / secs['text_gz'] / 1e6:.1f}",
                  f"{text_s / secs['text_gz']:.3f}"))
    for name in CODECS:
        prefix = "" if name == "none" else f"{name}_"
        table.append((f"gazette_spark.read lines {name} (native)",
                      f"{out[prefix + 'rows_per_s']:,}", f"{out[prefix + 'mb_per_s']}",
                      f"{out[prefix + 'vs_text']:.3f}"))
    table.append(("format('gazette') lines none (Python)",
                  f"{out['python_source_rows_per_s']:,}",
                  f"{size / secs['python/none'] / 1e6:.1f}",
                  f"{out['python_source_vs_text']:.3f}"))
    table.append(("Python source doing no work", f"{rows / secs['ceiling']:,.0f}",
                  f"{size / secs['ceiling'] / 1e6:.1f}", f"{out['ceiling_vs_text']:.3f}"))
    table.append(("spark.read.json (.raw ndjson)", f"{out['read_json_rows_per_s']:,}",
                  f"{json_size / secs['read_json'] / 1e6:.1f}", ""))
    table.append(("gazette json", f"{out['json_rows_per_s']:,}",
                  f"{out['json_mb_per_s']}", ""))
    table.append(("gazette json readCommitted",
                  f"{out['json_read_committed_rows_per_s']:,}",
                  f"{json_size / secs['json_rc'] / 1e6:.1f}",
                  f"{out['json_read_committed_vs_read_json']:.3f} of read.json"))
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    log("")
    for r in table:
        log("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    log(f"({rows:,} lines, {size / 1e6:.0f} MB per lines data set; {json_rows:,} json "
        f"messages, {json_size / 1e6:.0f} MB, {committed:,} committed; median of "
        f"{args.runs} scans ({args.action}) after a warm-up; targets: vs text >= "
        f"{TARGETS['vs_text']} (none, gzip), json readCommitted >= "
        f"{TARGETS['json_read_committed_vs_read_json']} x spark.read.json)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512,
                        help="MiB of text lines per codec (default 512)")
    parser.add_argument("--json-mb", type=int, default=128,
                        help="MiB of ndjson messages (default 128)")
    parser.add_argument("--journals", type=int, default=4,
                        help="journals per data set (default 4)")
    parser.add_argument("--fragment-mb", type=int, default=32,
                        help="MiB per fragment (default 32)")
    parser.add_argument("--runs", type=int, default=3,
                        help="timed scans per figure after the warm-up (default 3)")
    parser.add_argument("--action", choices=("noop", "sum-length"), default="noop",
                        help="what each timed scan does with the rows: the noop sink "
                        "(default), or sum(length(value)) (more JVM work per row on both "
                        "sides)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp dir (the fragments) and print where it is")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gazette-spark-bench-"))
    try:
        result = run(tmp, args)
    finally:
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
