"""A journal as an Iceberg table, read by Spark: `IcebergSink` on a shard over a journal
of every kind of input (committed, transactions, a rolled-back one, appends sent twice),
run in two parts (the second from the table's checkpoint), then compacted; Spark reads
the table's data files (``python -m gazette.iceberg files``: no Iceberg runtime here) and
they hold exactly what the ``gazette`` source reads of the journal read-committed."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import ShardRunner
from gazette.iceberg import IcebergSink, TableConfig, TableSchema
from gazette_broker import BrokerServer
from tests.fixtures.consumer import produce, run_until, spec

pytestmark = pytest.mark.integration


async def test_spark_reads_the_table_a_shard_fed_as_the_journal_read_committed(
        spark: Any, broker_server: BrokerServer, sums_client: JournalClient,
        tmp_path: Path) -> None:
    config = TableConfig(f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/wh",
                         "sums.input")
    schema = TableSchema.parse("key string, n long", partition="none")
    rng = random.Random(5)
    for _ in range(2):  # (the second run starts from the table's checkpoint)
        await produce(sums_client, rng, 40)
        async with AppendQueue(sums_client) as queue:
            runner = ShardRunner(spec(), IcebergSink(config, schema), sums_client, queue)
            await run_until(runner, sums_client)
    await broker_server.broker.replicas["sums/input"].roll()
    await broker_server.broker.persister.wait_idle()

    env = {"GAZETTE_ICEBERG_CATALOG": config.uri,
           "GAZETTE_ICEBERG_WAREHOUSE": config.warehouse, "PATH": "/usr/bin:/bin"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gazette.iceberg", *args],
                              capture_output=True, text=True, timeout=120, env=env)

    compacted = await asyncio.to_thread(cli, "compact", "--table", "sums.input",
                                        "--min-files", "2")
    assert compacted.returncode == 0, compacted.stderr
    assert "compacted sums.input:" in compacted.stdout
    listed = await asyncio.to_thread(cli, "files", "--table", "sums.input")
    assert listed.returncode == 0, listed.stderr
    files = listed.stdout.split()
    assert len(files) == 1  # (compacted: unpartitioned, one file)

    committed = spark.read.format("gazette").options(
        stores=Path(broker_server.file_root or "").as_uri() + "/",
        journals="name=sums/input", framing="json", readCommitted="true",
        schema="key string, n bigint")
    want = await asyncio.to_thread(lambda: sorted(
        (r["offset"], r["data"]["key"], r["data"]["n"]) for r in committed.load().collect()))
    got = await asyncio.to_thread(lambda: sorted(
        (r["_offset"], r["key"], r["n"]) for r in spark.read.parquet(*files).collect()))
    assert len(want) > 60 and got == want

    bad = await asyncio.to_thread(cli, "files", "--table", "nope")
    assert bad.returncode == 2 and "namespace.table" in bad.stderr
    missing = await asyncio.to_thread(cli, "files", "--table", "sums.nope")
    assert missing.returncode == 1 and "NoSuchTable" in missing.stderr
