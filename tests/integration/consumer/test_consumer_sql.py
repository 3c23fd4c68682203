"""SQLStore on a real PostgreSQL: the application's writes and the checkpoint commit in
one transaction; a fenced-out store's commit fails and leaves nothing; a shard running on
it over a real broker counts exactly once across crashes; one that reads a row and
writes it back loses no update while its transactions follow each other closely."""

from __future__ import annotations

import asyncio
import contextlib
import random
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import Application, Checkpoint, ShardRunner
from gazette.consumer.sql import SQLStore, StoreFenced
from gazette.message import Envelope, JsonMessage, Publisher
from tests.fixtures.consumer import crash_runs, run_until, spec, to
from tests.fixtures.postgres import PgDatabase

pytestmark = pytest.mark.integration

SUMS = ("CREATE TABLE IF NOT EXISTS sums (key TEXT PRIMARY KEY, total BIGINT NOT NULL)")
ADD = ("INSERT INTO sums (key, total) VALUES (%s, %s) ON CONFLICT (key) "
       "DO UPDATE SET total = sums.total + EXCLUDED.total")


def totals(db: PgDatabase) -> dict[str, int]:
    with psycopg.connect(db.dsn) as conn:
        conn.execute(SUMS)
        return dict(conn.execute("SELECT key, total FROM sums").fetchall())


async def test_the_checkpoint_commits_with_the_app_and_a_fence_stops_a_zombie(
        pg_database: PgDatabase) -> None:
    totals(pg_database)  # makes the table
    zombie, primary = SQLStore(pg_database.dsn, "app/shard-0"), SQLStore(
        pg_database.dsn, "app/shard-0")
    try:
        assert await zombie.restore_checkpoint() == Checkpoint()
        await zombie.execute(ADD, ("a", 1))
        await zombie.start_commit(Checkpoint({"in": 10}), [])
        assert totals(pg_database) == {"a": 1}

        await zombie.execute(ADD, ("a", 100))  # its next transaction, meanwhile...
        assert await primary.restore_checkpoint() == Checkpoint({"in": 10})  # fenced
        with pytest.raises(StoreFenced, match="app/shard-0: its checkpoint was restored "
                                              "by another process"):
            await zombie.start_commit(Checkpoint({"in": 20}), [])
        assert totals(pg_database) == {"a": 1}  # nothing of the zombie's landed

        await primary.execute(ADD, ("a", 2))
        await primary.start_commit(Checkpoint({"in": 15}), [])
        assert totals(pg_database) == {"a": 3}
        again = SQLStore(pg_database.dsn, "app/shard-0")
        assert await again.restore_checkpoint() == Checkpoint({"in": 15})
        await again.close()
    finally:
        await zombie.close()
        await primary.close()


async def test_a_failed_append_rolls_the_transaction_back(pg_database: PgDatabase) -> None:
    totals(pg_database)
    store = SQLStore(pg_database.dsn, "app/shard-1")
    try:
        await store.restore_checkpoint()
        await store.execute(ADD, ("b", 5))
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(OSError("append failed"))
        with pytest.raises(OSError):
            await store.start_commit(Checkpoint({"in": 1}), [failed])
        assert totals(pg_database) == {}
    finally:
        await store.close()


class SqlSums(Application):
    """Adds each message's ``n`` to its key's row."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def new_store(self, shard: Any) -> SQLStore:
        return SQLStore(self.dsn, shard.id)

    async def consume_message(self, shard: Any, store: SQLStore, envelope: Envelope,
                              publisher: Publisher) -> None:
        await store.execute(ADD, (envelope.message["key"], envelope.message["n"]))


async def test_a_shard_counts_exactly_once_across_crashes(
        sums_client: JournalClient, pg_database: PgDatabase) -> None:
    totals(pg_database)
    rng = random.Random(5)
    async with AppendQueue(sums_client) as out:
        expected = await crash_runs(sums_client, out, lambda: SqlSums(pg_database.dsn),
                                    rng, 3)
        final = ShardRunner(spec(), SqlSums(pg_database.dsn), sums_client, out)
        await run_until(final, sums_client)
    assert totals(pg_database) == {k: v for k, v in expected.items() if v}


class ReadModifyWrite(Application):
    """Adds each message's ``n`` to one row by reading it, then writing it back: what a
    handler written without thought of the previous commit does."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def new_store(self, shard: Any) -> SQLStore:
        return SQLStore(self.dsn, shard.id)

    async def consume_message(self, shard: Any, store: SQLStore, envelope: Envelope,
                              publisher: Publisher) -> None:
        cur = await store.execute("SELECT total FROM sums WHERE key = 'all'")
        row = await cur.fetchone()
        total = (row[0] if row else 0) + envelope.message["n"]
        await store.execute("INSERT INTO sums VALUES ('all', %s) ON CONFLICT (key) "
                            "DO UPDATE SET total = EXCLUDED.total", (total,))

    def finalize_txn(self, shard: Any, store: SQLStore, publisher: Publisher) -> None:
        # The commit waits for this append: the next transaction runs meanwhile.
        publisher.publish_uncommitted(to("sums/output"), JsonMessage(key="all", delta=0))


async def test_read_modify_write_loses_no_update_under_a_stream_of_transactions(
        sums_client: JournalClient, pg_database: PgDatabase) -> None:
    totals(pg_database)
    sent = 0
    async with AppendQueue(sums_client) as out, AppendQueue(sums_client) as queue:
        publisher = Publisher(queue)
        # Under load, short transactions: each starts while the one before commits.
        runner = ShardRunner(spec(max_txn_duration=timedelta(milliseconds=10)),
                             ReadModifyWrite(pg_database.dsn), sums_client, out)
        task = asyncio.create_task(runner.run())
        try:
            while runner.shard.progress.transactions < 100:
                assert not task.done(), task
                assert sent < 20_000, "the shard commits too little"
                await asyncio.gather(*(publisher.publish_committed(
                    to("sums/input"), JsonMessage(key="all", n=1)) for _ in range(4)))
                sent += 4
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await run_until(ShardRunner(spec(), ReadModifyWrite(pg_database.dsn), sums_client,
                                    out), sums_client)
    assert totals(pg_database) == {"all": sent}
