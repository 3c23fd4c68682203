"""The transactional outbox (PostgreSQL): events produced inside the application's own
database transaction are rows of an outbox table written in that transaction, so they
exist if and only if it commits. After the commit they are published and deleted; rows
left by a crash in between are swept by the catch-up producer.

Publishing claims rows by deleting them in an open transaction (``DELETE ... RETURNING``
locks them), appends them, and commits the delete only once the appends are
acknowledged. A failed append rolls the delete back, leaving the rows for later. The
catch-up producer claims with ``FOR UPDATE SKIP LOCKED``, so any number of instances
sweep at once without taking the same row, and never a row whose own producer is
publishing it. A crash after the appends but before the delete commits sends those
events again (at-least-once): readers tell them apart by event id, which exactly-once
handlers record (``gazette_events_processed``).

Tables (made if missing, by `ensure_schema`)::

    gazette_events_outbox (id BIGSERIAL PRIMARY KEY, topic TEXT, event_id TEXT,
                           key TEXT, time DOUBLE PRECISION, data BYTEA,
                           created TIMESTAMPTZ DEFAULT now())
    gazette_events_processed (grp TEXT, handler TEXT, event_id TEXT,
                              processed TIMESTAMPTZ DEFAULT now(),
                              PRIMARY KEY (grp, handler, event_id))
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import psycopg

from gazette.events import metrics
from gazette.message import JsonMessage

log = logging.getLogger("gazette.events")

OUTBOX, PROCESSED = "gazette_events_outbox", "gazette_events_processed"
#: Seconds a connection may take to open, a statement to run, a publish to be acked.
CONNECT_TIMEOUT, STATEMENT_TIMEOUT, PUBLISH_TIMEOUT = 10, 30.0, 30.0

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {OUTBOX} (
    id BIGSERIAL PRIMARY KEY, topic TEXT NOT NULL, event_id TEXT NOT NULL,
    key TEXT NOT NULL, time DOUBLE PRECISION NOT NULL, data BYTEA NOT NULL,
    created TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS {PROCESSED} (
    grp TEXT NOT NULL, handler TEXT NOT NULL, event_id TEXT NOT NULL,
    processed TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (grp, handler, event_id));
"""

INSERT = (f"INSERT INTO {OUTBOX} (topic, event_id, key, time, data) SELECT * FROM "
          "unnest(%s::text[], %s::text[], %s::text[], %s::float8[], %s::bytea[])")
CLAIM = f"DELETE FROM {OUTBOX} WHERE id = ANY(%s) RETURNING topic, event_id, key, time, data"
SWEEP = (f"DELETE FROM {OUTBOX} WHERE id IN (SELECT id FROM {OUTBOX} "
         "WHERE created < now() - make_interval(secs => %s) ORDER BY id "
         "LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING topic, event_id, key, time, data")

Row = tuple[str, str, str, float, bytes]
#: Appends rows (topic, event id, key, time, data) and waits for their acknowledgement.
Publish = Callable[[Sequence[Row], str], Awaitable[None]]


async def connect(dsn: str) -> psycopg.AsyncConnection[Any]:
    ms = int(STATEMENT_TIMEOUT * 1000)
    return await psycopg.AsyncConnection.connect(
        dsn, connect_timeout=CONNECT_TIMEOUT, options=f"-c statement_timeout={ms}",
        autocommit=True)


async def ensure_schema(dsn: str) -> None:
    """Make the outbox and processed tables if missing (processes starting at once take
    turns: a concurrent CREATE TABLE IF NOT EXISTS can fail)."""
    async with await connect(dsn) as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)",
                           (zlib.crc32(b"gazette-events-schema"),))
        await conn.execute(SCHEMA)


def message_of(row: Row) -> JsonMessage:
    """The journal line of an outbox row (`data` is already JSON: passed through)."""
    _, event_id, key, time, data = row
    return JsonMessage(id=event_id, key=key, time=time, data=msgspec.Raw(bytes(data)))


class OutboxTx:
    """What `Events.transaction` yields: `connection` is the caller's connection, in
    the open transaction; `produce` adds events to the outbox of that transaction."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self.connection = connection
        self._rows: tuple[list[str], list[str], list[str], list[float], list[bytes]] = (
            [], [], [], [], [])
        self.ids: list[int] = []

    def add(self, topic: str, line: JsonMessage) -> None:
        topics, event_ids, keys, times, datas = self._rows
        topics.append(topic)
        event_ids.append(line["id"])
        keys.append(line["key"])
        times.append(line["time"])
        datas.append(msgspec.json.encode(line["data"]))

    async def flush(self) -> None:
        """Write what was added, in one statement, within the transaction."""
        if not self._rows[0]:
            return
        cur = await self.connection.execute(INSERT + " RETURNING id", self._rows)
        self.ids = [int(r[0]) for r in await cur.fetchall()]


async def publish_claimed(conn: psycopg.AsyncConnection[Any], query: str, params: Any,
                          publish: Publish, path: str) -> int:
    """Claim rows by `query` (a DELETE ... RETURNING), publish them, commit the claim;
    a failed publish rolls it back (the rows stay). Returns how many were published."""
    async with conn.transaction():
        cur = await conn.execute(query, params)
        rows: list[Row] = await cur.fetchall()
        if rows:
            async with asyncio.timeout(PUBLISH_TIMEOUT):
                await publish(rows, path)
    return len(rows)


class CatchUp:
    """Sweeps outbox rows older than `min_age` seconds every `interval`, `batch` rows
    per transaction; counts the outbox (`gazette_events_outbox_depth`) and removes
    processed-event records older than `processed_retention` seconds."""

    def __init__(self, dsn: str, publish: Publish, *, interval: float = 5.0,
                 min_age: float = 5.0, batch: int = 256,
                 processed_retention: float = 7 * 86400) -> None:
        self.dsn, self.publish = dsn, publish
        self.interval, self.min_age, self.batch = interval, min_age, batch
        self.processed_retention = processed_retention

    async def sweep(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """Publish every row old enough (returns how many)."""
        total = 0
        while True:
            n = await publish_claimed(conn, SWEEP, (self.min_age, self.batch), self.publish,
                                      "catch_up")
            total += n
            if n < self.batch:
                break
        if total:
            log.info("outbox: the catch-up producer published %d event(s) left behind",
                     total)
        return total

    async def run(self) -> None:
        """Sweep for ever (a failure propagates: the owner's supervisor retries)."""
        async with await connect(self.dsn) as conn:
            while True:
                await self.sweep(conn)
                cur = await conn.execute(f"SELECT count(*) FROM {OUTBOX}")
                row = await cur.fetchone()
                metrics.OUTBOX_DEPTH.set(row[0] if row else 0)
                await conn.execute(
                    f"DELETE FROM {PROCESSED} WHERE processed < now() - "
                    "make_interval(secs => %s)", (self.processed_retention,))
                await asyncio.sleep(self.interval)
