"""Stream-sum's stores of sums: PostgreSQL (`SqlSums`, through `SQLStore`) and SQLite on
the shard's recovery log (`SqliteSums`). Each reads a shard's rows once, at restore, and
writes the rows a transaction changed (`dirty`) as the transaction finishes."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Sequence
from typing import Any

from gazette.consumer import Checkpoint, Shard
from gazette.errors import GazetteError

#: Advisory lock of the table's creation (concurrent CREATE ... IF NOT EXISTS collide).
_LOCK = 0x5354524D53554D
_TABLE = ("CREATE TABLE IF NOT EXISTS stream_sums (shard TEXT NOT NULL, stream_id TEXT "
          "NOT NULL, seq BIGINT NOT NULL, sum BIGINT NOT NULL, chunks BIGINT NOT NULL, "
          "done BOOLEAN NOT NULL, PRIMARY KEY (shard, stream_id))")
_UPSERT = ("INSERT INTO stream_sums VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (shard, "
           "stream_id) DO UPDATE SET seq = EXCLUDED.seq, sum = EXCLUDED.sum, "
           "chunks = EXCLUDED.chunks, done = EXCLUDED.done")


class SqlSums:
    """A shard's sums in the table ``stream_sums`` through an `SQLStore`. Rows are read
    once, at restore, and kept with this run's changes: transactions are pipelined, so a
    row read from the database could miss the commit still under way (and a failed
    commit ends the run, and this store with it)."""

    #: Nothing a transaction reads comes from the database: the next one may run while
    #: the last one commits (`SQLStore`).
    pipelined = True

    def __init__(self, dsn: str, app: str, shard: str) -> None:
        from gazette.consumer.sql import SQLStore  # psycopg: only when it is used

        self.sql, self.shard = SQLStore(dsn, f"{app}/{shard}"), shard
        self.state: dict[str, dict[str, Any]] = {}
        self.dirty: set[str] = set()

    async def restore_checkpoint(self) -> Checkpoint:
        checkpoint = await self.sql.restore_checkpoint()
        conn = self.sql.connection
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            await conn.execute(_TABLE)
            cur = await conn.execute("SELECT stream_id, seq, sum, chunks, done FROM "
                                     "stream_sums WHERE shard = %s", (self.shard,))
            self.state = {r[0]: {"seq": r[1], "sum": r[2], "chunks": r[3], "done": r[4]}
                          for r in await cur.fetchall()}
        self.dirty.clear()
        return checkpoint

    async def write(self) -> None:
        """Write the rows this transaction changed (one pipelined batch)."""
        rows = [(self.shard, s, *self.state[s].values()) for s in sorted(self.dirty)]
        self.dirty.clear()
        if rows:
            async with self.sql.connection.cursor() as cur:
                await cur.executemany(_UPSERT, rows)

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]:
        return self.sql.start_commit(checkpoint, wait_for)

    async def close(self) -> None:
        await self.sql.close()


class SqliteSums:
    """A shard's sums in a `SQLiteStore` on its recovery log (table ``sums``). As with
    `SqlSums`, rows are read at restore and this run's changes written per transaction."""

    def __init__(self, shard: Shard) -> None:
        from gazette.consumer import SQLiteStore  # apsw: only when it is used

        # SQLiteStore's options, as JSON (the fault tests turn every mode on often).
        raw = os.environ.get("STREAM_SUM_SQLITE") or "{}"
        try:
            options = json.loads(raw)
            self.sqlite = SQLiteStore(shard.folder, **options)
        except (ValueError, TypeError) as err:
            raise GazetteError(f"STREAM_SUM_SQLITE: expected a JSON object of "
                               f"SQLiteStore's options, got {raw!r}: {err}") from None
        self.state: dict[str, dict[str, Any]] = {}
        self.dirty: set[str] = set()

    @property
    def commits_in_flight(self) -> int:
        return self.sqlite.commits_in_flight

    async def restore_checkpoint(self) -> Checkpoint:
        checkpoint = await self.sqlite.restore_checkpoint()
        db = self.sqlite.db
        db.execute("CREATE TABLE IF NOT EXISTS sums (stream_id TEXT PRIMARY KEY, seq INTEGER"
                   ", sum INTEGER, chunks INTEGER, done INTEGER)")
        self.state = {r[0]: {"seq": r[1], "sum": r[2], "chunks": r[3], "done": bool(r[4])}
                      for r in db.execute("SELECT * FROM sums")}
        self.dirty.clear()
        return checkpoint

    def write(self) -> None:
        rows = [(s, *self.state[s].values()) for s in sorted(self.dirty)]
        self.dirty.clear()
        if rows:
            self.sqlite.db.executemany("INSERT OR REPLACE INTO sums VALUES (?, ?, ?, ?, ?)",
                                       rows)

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]:
        return self.sqlite.start_commit(checkpoint, wait_for)

    async def close(self) -> None:
        await self.sqlite.close()
