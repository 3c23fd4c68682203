"""`SQLStore`: a shard's state in PostgreSQL tables of the application's own, with the
checkpoint and a fence in the same transaction.

Each consumer transaction is one database transaction: the application runs its
statements through `execute` (or `connection`), and the commit writes the checkpoint in
the same transaction, guarded by the shard's fence. `restore_checkpoint` increments the
fence, so once a new primary has restored, a zombie primary's commit finds the fence
moved, fails (`StoreFenced`), and rolls back everything it did: its effects never land.

Two connections take turns: while one commits, the next consumer transaction may run on
the other. Under READ COMMITTED that transaction reads rows as they were before the
commit under way, so a read-then-write (SELECT a total, UPDATE it) would overwrite what
the commit wrote: by default (`pipelined` false) the next transaction begins only once
the commit is done. An application whose statements never read what the previous
transaction wrote (upserts that add, ``n = t.n + excluded.n``, which wait for the row's
lock and then see the committed row; values kept in memory) may say ``pipelined=True``.
psycopg 3 is the driver: measured against asyncpg on this
pattern (`benchmarks/sql_drivers.py`) the two are equal, the round trip per statement
being the cost, and psycopg is a dependency already (its pipeline mode is the lever).

The checkpoint table is made if missing::

    CREATE TABLE IF NOT EXISTS gazette_checkpoints (
        shard_fqn  TEXT PRIMARY KEY,
        fence      BIGINT NOT NULL,
        checkpoint BYTEA NOT NULL)
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from gazette.consumer.checkpoint import Checkpoint
from gazette.consumer.store import StoreFenced
from gazette.errors import ValidationError
from gazette.names import validate_token

#: Seconds a connection may take to open, and a statement to run.
CONNECT_TIMEOUT, STATEMENT_TIMEOUT = 10, 30.0


class SQLStore:
    """The store of shard `shard_fqn` in the PostgreSQL database at `dsn`; with
    `pipelined`, a transaction runs while the one before commits (see above)."""

    def __init__(self, dsn: str, shard_fqn: str, *, table: str = "gazette_checkpoints",
                 statement_timeout: float = STATEMENT_TIMEOUT, pipelined: bool = False
                 ) -> None:
        if not shard_fqn:
            raise ValidationError("shard_fqn", "must not be empty")
        self.dsn, self.shard_fqn = dsn, shard_fqn
        #: Read by the runner: whether the next transaction may run during a commit.
        self.pipelined = pipelined
        self.table = sql.Identifier(validate_token(table, "table", "_", 1, 63))
        #: The advisory lock under which restores make the table (see restore_checkpoint).
        self._create_lock = zlib.crc32(f"gazette-checkpoints:{table}".encode())
        self.statement_timeout = statement_timeout
        self.fence = 0
        self._conns: list[psycopg.AsyncConnection[Any]] = []
        self._current = 0

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        ms = int(self.statement_timeout * 1000)
        return await psycopg.AsyncConnection.connect(
            self.dsn, connect_timeout=CONNECT_TIMEOUT, options=f"-c statement_timeout={ms}")

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        """The connection of the open consumer transaction (its database transaction
        begins with its first statement)."""
        if not self._conns:
            raise RuntimeError("SQLStore: restore_checkpoint() first")
        return self._conns[self._current]

    async def execute(self, query: Any, params: Any = None) -> psycopg.AsyncCursor[Any]:
        """Run `query` within the open consumer transaction."""
        return await self.connection.execute(query, params)

    async def restore_checkpoint(self) -> Checkpoint:
        """Connect, make the checkpoint table if missing, move the fence, and return the
        last committed checkpoint."""
        if not self._conns:
            self._conns = [await self._connect(), await self._connect()]
        conn = self._conns[0]
        async with conn.transaction():
            # Shards restoring at once would race to make the table (a concurrent CREATE
            # TABLE IF NOT EXISTS fails with DuplicateTable): they take turns.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._create_lock,))
            await conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (shard_fqn TEXT PRIMARY KEY, "
                "fence BIGINT NOT NULL, checkpoint BYTEA NOT NULL)").format(self.table))
        async with conn.transaction():
            cur = await conn.execute(sql.SQL(
                "INSERT INTO {t} AS c (shard_fqn, fence, checkpoint) VALUES (%s, 1, '') "
                "ON CONFLICT (shard_fqn) DO UPDATE SET fence = c.fence + 1 "
                "RETURNING fence, checkpoint").format(t=self.table), (self.shard_fqn,))
            row = await cur.fetchone()
        assert row is not None
        self.fence, raw = int(row[0]), bytes(row[1])
        self._current = 0
        return Checkpoint.decode(raw) if raw else Checkpoint()

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]:
        """Commit the open transaction with `checkpoint`, once `wait_for` are done; the
        next transaction uses the other connection."""
        conn = self.connection
        self._current = 1 - self._current
        data = checkpoint.encode()

        async def commit() -> None:
            try:
                if wait_for:
                    await asyncio.gather(*wait_for)
                cur = await conn.execute(sql.SQL(
                    "UPDATE {} SET checkpoint = %s WHERE shard_fqn = %s AND fence = %s"
                ).format(self.table), (data, self.shard_fqn, self.fence))
                if cur.rowcount != 1:
                    raise StoreFenced(
                        f"shard {self.shard_fqn}: its checkpoint was restored by another "
                        f"process since this one (fence {self.fence}): the transaction is "
                        "rolled back")
                await conn.commit()
            except BaseException:
                await conn.rollback()
                raise

        return asyncio.ensure_future(commit())

    async def close(self) -> None:
        conns, self._conns = self._conns, []
        for conn in conns:
            await conn.close()
