"""The PostgreSQL fixtures give a real server, a fresh database per test, and clear
errors when PostgreSQL is missing."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from tests.fixtures.postgres import PgDatabase, PgServer, find_pg_bin
from tests.fixtures.procs import ComponentError, port_open

pytestmark = pytest.mark.integration

_seen_databases: list[str] = []


def _assert_fresh_database(db: PgDatabase) -> None:
    """Empty, unseen, and the same table name can be created in each test's database."""
    assert db.name not in _seen_databases
    _seen_databases.append(db.name)
    with psycopg.connect(db.dsn) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (db.name,)
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone()
        assert tables == (0,)
        conn.execute("CREATE TABLE shared_name (id int)")


def test_database_is_fresh_a(pg_database: PgDatabase) -> None:
    _assert_fresh_database(pg_database)


def test_database_is_fresh_b(pg_database: PgDatabase) -> None:
    _assert_fresh_database(pg_database)


def test_sync_table_round_trip(pg_database: PgDatabase) -> None:
    with psycopg.connect(pg_database.dsn) as conn:
        conn.execute("CREATE TABLE checkpoints (shard text PRIMARY KEY, offsets jsonb)")
        conn.execute(
            "INSERT INTO checkpoints VALUES (%s, %s)", ("shard-000", '{"a/journal": 1024}')
        )
        conn.commit()
        row = conn.execute("SELECT shard, offsets FROM checkpoints").fetchone()
    assert row == ("shard-000", {"a/journal": 1024})


async def test_async_table_round_trip(pg_database: PgDatabase) -> None:
    async with await psycopg.AsyncConnection.connect(pg_database.dsn) as conn:
        await conn.execute("CREATE TABLE t (id serial PRIMARY KEY, body text)")
        await conn.execute("INSERT INTO t (body) VALUES (%s), (%s)", ("one", "two"))
        await conn.commit()
        cur = await conn.execute("SELECT body FROM t ORDER BY id")
        assert await cur.fetchall() == [("one",), ("two",)]


def test_server_runs_as_non_root(pg_server: PgServer) -> None:
    with pg_server.connect() as conn:
        data_dir, backend_pid = conn.execute(
            "SELECT current_setting('data_directory'), pg_backend_pid()"
        ).fetchone()  # type: ignore[misc]
        backend_uid = _proc_uid(backend_pid)  # while connected: the backend exits after
    assert Path(data_dir) == pg_server.data_dir
    owner = os.stat(data_dir).st_uid
    postmaster_uid = _proc_uid(pg_server.pid)
    assert backend_uid == postmaster_uid == owner
    if os.geteuid() == 0:
        assert owner != 0, "PostgreSQL must not run as root"


def _proc_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


def test_dropped_after_test(pg_server: PgServer) -> None:
    """`drop()` works even with a client still connected (WITH FORCE)."""
    from tests.fixtures.postgres import create_database

    db = create_database(pg_server)
    lingering = psycopg.connect(db.dsn)
    try:
        db.drop()
    finally:
        lingering.close()
    with pg_server.connect() as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (db.name,)
        ).fetchone()
    assert found == (0,)


def test_restartable_keeps_committed_data(pg_server_restartable: PgServer) -> None:
    server = pg_server_restartable
    with server.connect() as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    server.stop()
    assert not server.running()
    assert not port_open(server.port)
    server.start()
    server.kill()
    server.start()
    with server.connect() as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [(7,)]


def test_missing_pg_bin_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ComponentError) as err:
        find_pg_bin({"PG_BIN": str(empty), "PATH": ""})
    message = str(err.value)
    assert f"$PG_BIN={empty}" in message
    assert "apt-get install postgresql" in message


def test_nothing_found_lists_what_was_searched(tmp_path: Path) -> None:
    with pytest.raises(ComponentError) as err:
        find_pg_bin({"PATH": str(tmp_path)}, lib_root=tmp_path / "no-such-root")
    message = str(err.value)
    assert "$PG_BIN (unset)" in message
    assert f"{tmp_path}/no-such-root/*/bin" in message
    assert f"initdb on PATH='{tmp_path}'" in message
    assert "apt-get install postgresql" in message


def test_finds_binaries_on_this_machine() -> None:
    bin_dir = find_pg_bin({k: v for k, v in os.environ.items() if k != "PG_BIN"})
    assert (bin_dir / "initdb").exists()
    assert (bin_dir / "postgres").exists()
