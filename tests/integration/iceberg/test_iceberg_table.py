"""`IcebergStore` and compaction on real catalogs (SQLite in a temp dir, PostgreSQL) and
warehouses (a folder, S3 on moto): each transaction's rows and checkpoint in one commit,
a restore fencing out the shard's earlier holder, shards of one table committing at once,
schemas declared or of a topic's model, values that do not fit, a table evolved, and
compaction that loses nothing while shards append."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from gazette.consumer import Checkpoint, StoreFenced
from gazette.errors import ValidationError
from gazette.events import Topic
from gazette.iceberg import (
    BadValue,
    IcebergStore,
    SharedCatalog,
    TableConfig,
    TableSchema,
    compact,
    data_files,
)
from gazette.message.uuid import Clock, build
from tests.fixtures.postgres import PgDatabase
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration

COLUMNS = "word string, n long, tags list<string>"


@dataclasses.dataclass
class OrderPlaced:
    order_id: int
    customer: str
    cents: int


ORDERS = Topic("orders", OrderPlaced)
DAY = 86400


def uuid_at(seconds: float, producer: int = 7) -> int:
    return build(producer, Clock.from_unix(seconds), 0)


def config_in(tmp_path: Path, table: str = "ns.words") -> TableConfig:
    return TableConfig(f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/warehouse",
                       table)


def feed(store: IcebergStore, journal: str, offsets: range, at: float = 1.7e9) -> None:
    for o in offsets:
        store.rows.add(journal, o, uuid_at(at + o), {"word": f"w{o}", "n": o,
                                                     "tags": ["a", str(o)]})


def checkpoint(journal: str, offset: int) -> Checkpoint:
    return Checkpoint(sources={journal: offset})


def rows_of(store: IcebergStore) -> list[tuple[str, int]]:
    table = store.table
    table.refresh()
    got = table.scan(selected_fields=("_journal", "_offset")).to_arrow().to_pylist()
    return sorted((r["_journal"], r["_offset"]) for r in got)


async def test_rows_and_checkpoint_commit_together_and_a_restore_fences_the_last_holder(
        tmp_path: Path) -> None:
    schema = TableSchema.parse(COLUMNS)
    first = IcebergStore(config_in(tmp_path), schema, "app/part-000")
    assert await first.restore_checkpoint() == Checkpoint()
    feed(first, "j/a", range(0, 10))
    await first.start_commit(checkpoint("j/a", 100), [])
    feed(first, "j/a", range(10, 15))
    await first.start_commit(checkpoint("j/a", 150), [])
    assert rows_of(first) == [("j/a", o) for o in range(15)]
    snapshot = first.table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary["gazette.shard"] == "app/part-000"
    assert snapshot.summary["gazette.offsets"] == "j/a:150"

    # Another process takes the shard: it restores the last commit and moves the fence.
    second = IcebergStore(config_in(tmp_path), schema, "app/part-000")
    assert (await second.restore_checkpoint()).sources == {"j/a": 150}
    feed(first, "j/a", range(15, 20))  # the zombie's transaction is refused whole
    with pytest.raises(StoreFenced, match="restored by another process"):
        await first.start_commit(checkpoint("j/a", 200), [])
    feed(second, "j/a", range(15, 18))
    await second.start_commit(checkpoint("j/a", 180), [])
    assert rows_of(second) == [("j/a", o) for o in range(18)]
    third = IcebergStore(config_in(tmp_path), schema, "app/part-000")
    assert (await third.restore_checkpoint()).sources == {"j/a": 180}
    for s in (first, second, third):
        await s.close()


async def test_a_commit_waits_for_its_appends_and_fails_with_them(tmp_path: Path) -> None:
    store = IcebergStore(config_in(tmp_path), TableSchema.parse(COLUMNS), "app/s")
    await store.restore_checkpoint()
    feed(store, "j/a", range(3))
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(checkpoint("j/a", 30), [gate])
    feed(store, "j/a", range(3, 5))  # the next transaction's rows are not this commit's
    await asyncio.sleep(0)
    assert not commit.done() and rows_of(store) == []
    gate.set_result(None)
    await commit
    assert rows_of(store) == [("j/a", o) for o in range(3)]
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("an append failed"))
    with pytest.raises(RuntimeError, match="an append failed"):
        await store.start_commit(checkpoint("j/a", 50), [failed])
    assert rows_of(store) == [("j/a", o) for o in range(3)]
    await store.close()


async def test_shards_of_one_table_commit_at_once_on_postgres_and_s3(
        tmp_path: Path, pg_database: PgDatabase, s3_bucket: S3Bucket) -> None:
    """Four shards, each a transaction after another, conflicting at the catalog: every
    row lands once, each shard's checkpoint is its last. The catalog in PostgreSQL, the
    warehouse in S3."""
    server = s3_bucket.server
    config = TableConfig(pg_database.dsn.replace("postgresql://", "postgresql+psycopg://"),
                         f"s3://{s3_bucket.name}/warehouse", "ns.words", {
                             "s3.endpoint": server.endpoint_url, "s3.region": server.region,
                             "s3.access-key-id": server.access_key_id,
                             "s3.secret-access-key": server.secret_access_key})
    schema = TableSchema.parse(COLUMNS)
    catalog = SharedCatalog(config)
    stores = [IcebergStore(config, schema, f"app/part-{i}", catalog=catalog)
              for i in range(4)]
    await asyncio.gather(*(s.restore_checkpoint() for s in stores))

    async def run(i: int, store: IcebergStore) -> None:
        for t in range(5):
            base = i * 1000 + t * 10
            feed(store, f"j/{i}", range(base, base + 10))
            await store.start_commit(checkpoint(f"j/{i}", base + 10), [])

    await asyncio.gather(*(run(i, s) for i, s in enumerate(stores)))
    assert rows_of(stores[0]) == sorted(
        (f"j/{i}", o) for i in range(4) for t in range(5)
        for o in range(i * 1000 + t * 10, i * 1000 + t * 10 + 10))
    for i, s in enumerate(stores):
        raw = s.table.properties[f"gazette.checkpoint.app/part-{i}"]
        assert Checkpoint.decode(base64.b64decode(raw)).sources == {f"j/{i}": i * 1000 + 50}
        await s.close()
    assert all(path.startswith(f"s3://{s3_bucket.name}/warehouse/")
               for path in data_files(stores[0].table))


def test_schemas_are_declared_or_a_models_and_bad_ones_are_refused() -> None:
    @dataclasses.dataclass
    class Click:
        page: str
        ms: int
        ratio: float | None
        tags: list[str]

    schema = TableSchema.of_model(Click, partition="hour")
    assert [(c.name, c.kind, c.path) for c in schema.columns] == [
        ("event_id", "string", ("id",)), ("event_key", "string", ("key",)),
        ("event_time", "timestamptz", ("time",)), ("page", "string", ("data", "page")),
        ("ms", "long", ("data", "ms")), ("ratio", "double", ("data", "ratio")),
        ("tags", "list<string>", ("data", "tags"))]
    names = [f.name for f in schema.iceberg().fields]
    assert names[:4] == ["_journal", "_offset", "_uuid", "_published"]
    for ddl, field, reason in [("word", "columns[0]", "name type"),
                               ("word text", "columns[0]", "not one of"),
                               ("1x string", "columns[0]", "column name"),
                               ("_offset long", "columns[0]", "metadata"),
                               ("a long, a string", "columns", "twice"),
                               ("", "columns", "no column")]:
        with pytest.raises(ValidationError, match=reason) as err:
            TableSchema.parse(ddl)
        assert err.value.field == field
    with pytest.raises(ValidationError, match="hour, day, month, none"):
        TableSchema.parse("a long", partition="week")

    @dataclasses.dataclass
    class Odd:
        where: dict[str, int]

    with pytest.raises(ValidationError, match=r"Odd\.where"):
        TableSchema.of_model(Odd)


async def test_values_that_do_not_fit_fail_naming_where_or_become_null(
        tmp_path: Path) -> None:
    schema = TableSchema.parse("n long, at timestamp")
    store = IcebergStore(config_in(tmp_path), schema, "app/s")
    await store.restore_checkpoint()
    store.rows.add("j/a", 0, uuid_at(1.7e9), {"n": 1, "at": "2026-01-01T00:00:00Z"})
    store.rows.add("j/a", 9, uuid_at(1.7e9), {"n": "many", "at": 1.7e9})
    with pytest.raises(BadValue, match=r"j/a:9: column n \(long\): 'many'"):
        await store.start_commit(checkpoint("j/a", 20), [])
    with pytest.raises(BadValue, match=r"j/a:3: column at \(timestamp\)"):
        store.rows.add("j/a", 3, uuid_at(1.7e9), {"n": 2, "at": "yesterday"})
    assert rows_of(store) == []
    await store.close()

    lenient = IcebergStore(config_in(tmp_path),
                           dataclasses.replace(schema, bad_values="null"), "app/s")
    await lenient.restore_checkpoint()
    lenient.rows.add("j/a", 0, uuid_at(1.7e9), {"n": 1, "at": "2026-01-01T00:00:00Z"})
    lenient.rows.add("j/a", 9, uuid_at(1.7e9), {"n": "many", "at": "yesterday"})
    await lenient.start_commit(checkpoint("j/a", 20), [])
    got = lenient.table.scan().to_arrow().sort_by("_offset").to_pylist()
    assert [(r["_offset"], r["n"], r["at"] is None) for r in got] == [(0, 1, False),
                                                                      (9, None, True)]
    await lenient.close()


async def test_a_table_gains_new_columns_and_refuses_a_changed_type(tmp_path: Path) -> None:
    store = IcebergStore(config_in(tmp_path), TableSchema.parse("word string"), "app/s")
    await store.restore_checkpoint()
    store.rows.add("j/a", 0, uuid_at(1.7e9), {"word": "old"})
    await store.start_commit(checkpoint("j/a", 10), [])
    await store.close()
    wider = IcebergStore(config_in(tmp_path), TableSchema.parse("word string, n long"),
                         "app/s")
    assert (await wider.restore_checkpoint()).sources == {"j/a": 10}
    wider.rows.add("j/a", 10, uuid_at(1.7e9), {"word": "new", "n": 5})
    await wider.start_commit(checkpoint("j/a", 20), [])
    got = wider.table.scan().to_arrow().sort_by("_offset").to_pylist()
    assert [(r["word"], r["n"]) for r in got] == [("old", None), ("new", 5)]
    await wider.close()
    changed = IcebergStore(config_in(tmp_path), TableSchema.parse("word long"), "app/s")
    with pytest.raises(ValidationError, match=r"columns\.word"):
        await changed.restore_checkpoint()
    await changed.close()


async def test_compaction_rewrites_closed_partitions_and_loses_nothing_to_appends(
        tmp_path: Path) -> None:
    """Days of many small files become a file a day; today's are left; a shard appending
    all along loses no row (a compaction that lost the race reads the partition again)."""
    schema = TableSchema.parse(COLUMNS)
    store = IcebergStore(config_in(tmp_path), schema, "app/s")
    await store.restore_checkpoint()
    start = 1.7e9 - 1.7e9 % DAY
    for day in range(3):
        for t in range(4):
            base = day * 100 + t * 10
            feed(store, "j/a", range(base, base + 10), at=start + day * DAY - base)
            await store.start_commit(checkpoint("j/a", base + 10), [])
    before = len(data_files(store.table))
    assert before == 12

    appending = True

    async def append() -> int:
        n, base = 0, 10_000
        while appending:
            feed(store, "j/b", range(base, base + 5), at=start + 2 * DAY)
            await store.start_commit(checkpoint("j/a", 1000), [])
            n, base = n + 1, base + 5
        return n

    task = asyncio.create_task(append())
    replaced = await asyncio.to_thread(compact, store.table.catalog.load_table("ns.words"),
                                       min_files=4, before=start + 2 * DAY)
    appending = False
    commits = await task
    assert replaced == 8  # the first two days' 4 files each; the third is not closed
    want = sorted([("j/a", o) for day in range(3) for o in range(day * 100, day * 100 + 40)]
                  + [("j/b", o) for o in range(10_000, 10_000 + 5 * commits)])
    assert rows_of(store) == want
    files = data_files(store.table)
    assert len(files) == before - 8 + 2 + commits
    compacted = [f for f in files if "_published_day=" in f and pq.read_metadata(
        f.removeprefix("file://")).num_rows == 40]
    assert len(compacted) == 2
    await store.close()


def test_a_table_config_refuses_what_it_cannot_open(tmp_path: Path) -> None:
    for args, field in [(("mysql://x", "file:///w", "a.b"), "catalog uri"),
                        (("sqlite:///c.db", "w/", "a.b"), "warehouse"),
                        (("sqlite:///c.db", "file:///w", "ab"), "table")]:
        with pytest.raises(ValidationError) as err:
            TableConfig(*args)
        assert err.value.field == field
    env: dict[str, Any] = {"GAZETTE_ICEBERG_CATALOG": "sqlite:///c.db",
                           "GAZETTE_ICEBERG_WAREHOUSE": "file:///w"}
    with pytest.raises(ValidationError, match="GAZETTE_ICEBERG_TABLE"):
        TableConfig.from_env(env)
    config = TableConfig.from_env({**env, "GAZETTE_ICEBERG_TABLE": "a.b",
                                   "GAZETTE_ICEBERG_PROPERTIES": "s3.endpoint=http://x:1"})
    assert config.properties == {"s3.endpoint": "http://x:1"}
    with pytest.raises(ValidationError, match="key=value"):
        TableConfig.from_env({**env, "GAZETTE_ICEBERG_TABLE": "a.b",
                              "GAZETTE_ICEBERG_PROPERTIES": "oops"})


def test_a_sinks_schema_comes_from_its_columns_or_an_events_topic() -> None:
    from gazette.iceberg import schema_from_env

    declared = schema_from_env({"GAZETTE_ICEBERG_COLUMNS": "a long",
                                "GAZETTE_ICEBERG_PARTITION": "hour"})
    assert [c.name for c in declared.columns] == ["a"] and declared.partition == "hour"
    topic = schema_from_env({"GAZETTE_ICEBERG_TOPIC": f"{__name__}:ORDERS"})
    assert [(c.name, c.kind, c.path) for c in topic.columns][3:] == [
        ("order_id", "long", ("data", "order_id")),
        ("customer", "string", ("data", "customer")),
        ("cents", "long", ("data", "cents"))]
    for env, field, reason in [
            ({}, "GAZETTE_ICEBERG_COLUMNS", "one of them"),
            ({"GAZETTE_ICEBERG_COLUMNS": "a long", "GAZETTE_ICEBERG_TOPIC": "x:y"},
             "GAZETTE_ICEBERG_COLUMNS", "one of them"),
            ({"GAZETTE_ICEBERG_TOPIC": "no_such_module:T"}, "GAZETTE_ICEBERG_TOPIC",
             "cannot be loaded"),
            ({"GAZETTE_ICEBERG_TOPIC": "json:dumps"}, "GAZETTE_ICEBERG_TOPIC",
             "not a Topic"),
            ({"GAZETTE_ICEBERG_COLUMNS": "a long", "GAZETTE_ICEBERG_BAD_VALUES": "drop"},
             "bad_values", "fail or null")]:
        with pytest.raises(ValidationError, match=reason) as err:
            schema_from_env(env)
        assert err.value.field == field
