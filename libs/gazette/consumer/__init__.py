"""Consumers: shards that process journals' messages in exactly-once transactions.

An application subclasses `Application` (``consume_message``, ``finalize_txn``); each
shard runs it over its source journals (`ShardRunner`), read-committed, in transactions
whose checkpoint commits atomically with the application's state in its `Store`
(`MemoryStore`, `JSONFileStore`; `SQLStore` on PostgreSQL and `SQLiteStore` on the
shard's recovery log, imported on first use).
Its own gRPC methods and HTTP routes go on its members through `AppServices`.
"""

from typing import TYPE_CHECKING, Any

from gazette.consumer.app import Application
from gazette.consumer.app_services import AppServices, NoShardPrimary
from gazette.consumer.app_shard import Progress, Shard
from gazette.consumer.checkpoint import Checkpoint
from gazette.consumer.runner import ShardRunner, SourceError
from gazette.consumer.store import JSONFileStore, MemoryStore, Store, StoreFenced

if TYPE_CHECKING:  # typed for checkers; loaded on first use (below)
    from gazette.consumer.sql import SQLStore
    from gazette.consumer.sqlite import SQLiteStore


def __getattr__(name: str) -> Any:
    """`SQLStore` loads psycopg, `SQLiteStore` apsw: only when asked for."""
    if name == "SQLStore":
        from gazette.consumer import sql

        return sql.SQLStore
    if name == "SQLiteStore":
        from gazette.consumer import sqlite

        return sqlite.SQLiteStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AppServices",
    "Application",
    "Checkpoint",
    "JSONFileStore",
    "MemoryStore",
    "NoShardPrimary",
    "Progress",
    "SQLStore",
    "SQLiteStore",
    "Shard",
    "ShardRunner",
    "SourceError",
    "Store",
    "StoreFenced",
]
