"""psycopg 3 against asyncpg for SQLStore's pattern, on a local PostgreSQL started here.

Each consumer transaction is one database transaction: K upserts, each awaited on its own
(as an application's ``consume_message`` runs them), then the fenced checkpoint update
and the commit. Three alternating rounds per driver; the figure is rows per second
(the median round). The server runs with fsync off (this measures the drivers' and the
round trips' cost, not the disk). Prints one JSON object last.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures

import asyncpg
import psycopg
import uvloop

from tests.fixtures.postgres import create_database, start_pg_server

TXNS, ROWS = 300, 10
SETUP = ["CREATE TABLE IF NOT EXISTS sums (key TEXT PRIMARY KEY, total BIGINT NOT NULL)",
         "CREATE TABLE IF NOT EXISTS gazette_checkpoints (shard_fqn TEXT PRIMARY KEY, "
         "fence BIGINT NOT NULL, checkpoint BYTEA NOT NULL)",
         "INSERT INTO gazette_checkpoints VALUES ('bench', 1, '') ON CONFLICT DO NOTHING"]
UPSERT = ("INSERT INTO sums (key, total) VALUES ({0}, {1}) ON CONFLICT (key) "
          "DO UPDATE SET total = sums.total + EXCLUDED.total")
FENCED = ("UPDATE gazette_checkpoints SET checkpoint = {0} "
          "WHERE shard_fqn = 'bench' AND fence = {1}")
CHECKPOINT = b"x" * 200


async def with_psycopg(dsn: str) -> float:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        upsert, fenced = UPSERT.format("%s", "%s"), FENCED.format("%s", "%s")
        started = time.perf_counter()
        for t in range(TXNS):
            for r in range(ROWS):
                await conn.execute(upsert, (f"k{(t * ROWS + r) % 500}", 1))
            cur = await conn.execute(fenced, (CHECKPOINT, 1))
            assert cur.rowcount == 1
            await conn.commit()
        return TXNS * ROWS / (time.perf_counter() - started)


async def with_asyncpg(dsn: str) -> float:
    conn: Any = await asyncpg.connect(dsn)
    try:
        upsert, fenced = UPSERT.format("$1", "$2"), FENCED.format("$1", "$2")
        started = time.perf_counter()
        for t in range(TXNS):
            async with conn.transaction():
                for r in range(ROWS):
                    await conn.execute(upsert, f"k{(t * ROWS + r) % 500}", 1)
                status = await conn.execute(fenced, CHECKPOINT, 1)
                assert status == "UPDATE 1"
        return TXNS * ROWS / (time.perf_counter() - started)
    finally:
        await conn.close()


async def measure(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in SETUP:
            conn.execute(statement)
    rounds: dict[str, list[float]] = {"psycopg": [], "asyncpg": []}
    await with_psycopg(dsn)  # warm-up (connections, plans, caches)
    await with_asyncpg(dsn)
    for _ in range(3):
        rounds["psycopg"].append(await with_psycopg(dsn))
        rounds["asyncpg"].append(await with_asyncpg(dsn))
    psy, apg = (statistics.median(rounds[k]) for k in ("psycopg", "asyncpg"))
    for name, values in rounds.items():
        print(f"{name:8} rows/s: " + ", ".join(f"{v:,.0f}" for v in values))
    return {"txns": TXNS, "rows_per_txn": ROWS, "psycopg_rows_per_s": round(psy),
            "asyncpg_rows_per_s": round(apg), "asyncpg_vs_psycopg": round(apg / psy, 2)}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gz-pg-bench-") as tmp:
        server = start_pg_server(Path(tmp))
        try:
            db = create_database(server)
            result = uvloop.run(measure(db.dsn))
        finally:
            server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
