"""The Spark jobs over fragments real brokers wrote: export (incremental, to Parquet by
journal and date), audit (bad fragments, holes), word_count (equal to the word-count
rule of the consumer). Jobs run in-process on the test session's Spark (a job's
SparkSession is `getOrCreate`), and one from the command line, as a pod runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gazette.client import JournalClient
from gazette_broker import BrokerServer
from gazette_spark import audit, export, word_count
from tests.fixtures.broker import persist

pytestmark = pytest.mark.integration

T = TypeVar("T")
SPECS = """
name: jobs/
replication: 1
fragment: {length: 1073741824, stores: ["file:///"], refresh_interval: 1h0m0s,
           compression_codec: SNAPPY}
children:
  - name: jobs/a
  - name: jobs/b
    fragment: {compression_codec: GZIP}
"""
TEXT = {
    "jobs/a": [b"The quick brown fox\njumps over the lazy dog\n", b"Fox, fox! THE end\n"],
    "jobs/b": [b"caf\xc3\xa9 au lait\nthe caf\xc3\xa9_2 is open\n", b"\n   \nlast the\n"],
}


async def run(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


@pytest.fixture
async def stores(broker_server: BrokerServer) -> str:
    await broker_server.apply_yaml(SPECS)
    async with JournalClient(broker_server.grpc_address) as client:
        for journal, parts in TEXT.items():
            await persist(broker_server, client, journal, parts)
    return Path(broker_server.file_root or "").as_uri() + "/"


async def test_word_count_equals_the_consumers_rule(spark: Any, stores: str,
                                                     tmp_path: Path) -> None:
    out = tmp_path / "counts"
    code = await run(lambda: word_count.run(["--journals", "prefix=jobs/", "--stores",
                                             stores, "--output", str(out)]))
    assert code == 0
    [csv] = list(out.glob("part-*.csv"))
    got = {}
    for line in csv.read_text().splitlines()[1:]:
        word, count = line.rsplit(",", 1)
        got[word] = int(count)
    text = b"".join(b"".join(p) for p in TEXT.values()).decode()
    assert got == dict(Counter(re.findall(r"\w+", text.lower())))


async def test_word_count_of_a_field_counts_what_the_consumer_counts(
        spark: Any, broker_server: BrokerServer, tmp_path: Path) -> None:
    """--field text: the words of JSON messages' text field, each committed message once
    (a re-sent duplicate is not counted twice), by the word-count consumer's own rule."""
    from gazette.message import JsonMessage, framing_for
    from gazette.message.uuid import Flags, build, to_str
    from gazette_consumer.examples.word_count import words

    texts = ["The quick brown fox", "fox, FOX! the end", "", "café au lait"]
    docs = [JsonMessage(uuid=to_str(build(7, (i + 1) << 4, Flags.OUTSIDE_TXN)), text=t)
            for i, t in enumerate(texts)]
    resent = docs[:2]  # (an append sent again: the Sequencer drops it)
    encode = framing_for("application/x-ndjson").encode
    await broker_server.apply_yaml(SPECS.replace("  - name: jobs/a\n",
                                                 "  - name: jobs/messages\n"))
    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, "jobs/messages",
                      [encode(docs), encode(resent)])
    stores = Path(broker_server.file_root or "").as_uri() + "/"
    out = tmp_path / "counts"
    code = await run(lambda: word_count.run(["--journals", "name=jobs/messages", "--stores",
                                             stores, "--output", str(out), "--field",
                                             "text"]))
    assert code == 0
    [csv] = list(out.glob("part-*.csv"))
    got = {w: int(n) for w, n in (line.rsplit(",", 1) for line in
                                  csv.read_text().splitlines()[1:])}
    assert got == dict(Counter(w for t in texts for w in words(t)))
    assert got["fox"] == 3
    with pytest.raises(SystemExit):
        word_count.run(["--journals", "name=jobs/messages", "--stores", stores, "--output",
                        str(out), "--field", "text; drop"])


async def test_export_resumes_where_its_last_run_ended(
        spark: Any, stores: str, broker_server: BrokerServer, tmp_path: Path) -> None:
    out = tmp_path / "lake"
    argv = ["--journals", "prefix=jobs/", "--stores", stores, "--output", str(out)]
    assert await run(lambda: export.run(argv)) == 0
    folders = sorted(p.relative_to(out).parts[:2] for p in out.glob("journal=*/date=*"))
    assert [f[0] for f in folders] == ["journal=jobs%2Fa", "journal=jobs%2Fb"]
    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, "jobs/a", [b"one more line\n"])
    assert await run(lambda: export.run(argv)) == 0
    assert await run(lambda: export.run(argv)) == 0  # nothing new: nothing written
    df = spark.read.parquet(str(out))
    got = await run(lambda: sorted((r["journal"], r["offset"], r["value"], str(r["date"]))
                                   for r in df.collect()))
    want = []
    for journal, parts in {**TEXT, "jobs/a": [*TEXT["jobs/a"], b"one more line\n"]}.items():
        offset = 0
        for line in b"".join(parts).splitlines(keepends=True):
            want.append((journal, offset, line.rstrip(b"\n").decode()))
            offset += len(line)
    assert [g[:3] for g in got] == sorted(want)
    assert len({g[3] for g in got}) == 1  # lines carry no clock: the day of the run


async def test_audit_reports_bad_fragments_and_holes(
        spark: Any, stores: str, broker_server: BrokerServer, tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    argv = ["--journals", "prefix=jobs/", "--stores", stores, "--output", str(report_file)]
    assert await run(lambda: audit.run(argv)) == 0
    report = json.loads(report_file.read_text())
    assert report["jobs/a"]["fragments"] == 2 and report["jobs/a"]["bad"] == []
    assert report["jobs/a"]["holes"] == [] and report["jobs/b"]["end"] == sum(
        map(len, TEXT["jobs/b"]))
    # Corrupt a fragment of jobs/a; give jobs/b a third fragment and remove its second.
    root = Path(broker_server.file_root or "")
    a_frags = sorted((root / "jobs" / "a").iterdir())
    a_frags[0].write_bytes(b"not snappy")
    async with JournalClient(broker_server.grpc_address) as client:
        await persist(broker_server, client, "jobs/b", [b"third\n"])
    b_frags = sorted((root / "jobs" / "b").iterdir())
    b_frags[1].unlink()
    assert await run(lambda: audit.run(argv)) == 1
    report = json.loads(report_file.read_text())
    [bad] = report["jobs/a"]["bad"]
    assert a_frags[0].name in bad["fragment"] and bad["reason"]
    first = len(TEXT["jobs/b"][0])
    assert report["jobs/b"]["holes"] == [[first, first + len(TEXT["jobs/b"][1])]]


async def test_jobs_name_matching_journals_with_nothing_persisted_yet(
        spark: Any, broker_server: BrokerServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    await broker_server.apply_yaml(SPECS.replace("jobs/", "pending/"))
    async with JournalClient(broker_server.grpc_address) as client:
        await client.append("pending/a", b"appended, not persisted yet\n")
    argv = ["--journals", "prefix=pending/", "--broker", broker_server.grpc_address]
    report_file = tmp_path / "report.json"
    caplog.set_level("INFO", "gazette_spark")
    assert await run(lambda: audit.run([*argv, "--output", str(report_file)])) == 0
    empty = {"fragments": 0, "bytes": 0, "begin": None, "end": None, "holes": [],
             "pending": [], "overlaps": [], "bad": []}
    assert json.loads(report_file.read_text()) == {"pending/a": empty, "pending/b": empty}
    caplog.clear()
    out = tmp_path / "counts"
    assert await run(lambda: word_count.run([*argv, "--output", str(out)])) == 0
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [f"2 journals match --journals 'prefix=pending/' in "
                      f"{broker_server.grpc_address} (pending/a, pending/b), but none has "
                      "a persisted fragment yet: nothing to read (a broker persists a "
                      "fragment once it rolls its spool)"], warned
    assert not any("no journal matches" in r.getMessage() for r in caplog.records)


def test_a_job_runs_from_the_command_line_and_refuses_bad_arguments(
        tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    bad = subprocess.run([sys.executable, "-m", "gazette_spark.audit", "--journals",
                          "prefix=x/", "--stores", "ftp://nowhere/"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "stores" in bad.stderr and "Traceback" not in bad.stderr
    empty = tmp_path / "empty-store"
    empty.mkdir()
    done = subprocess.run([sys.executable, "-m", "gazette_spark.audit", "--stores",
                           empty.as_uri() + "/", "--master", "local[1]", "--conf",
                           "spark.ui.enabled=false"], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {} and "audit: 0 journals" in done.stderr
