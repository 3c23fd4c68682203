"""Consumers: shards that process journals' messages in exactly-once transactions.

An application subclasses `Application` (``consume_message``, ``finalize_txn``); each
shard runs it over its source journals (`ShardRunner`), read-committed, in transactions
whose checkpoint commits atomically with the application's state in its `Store`
(`MemoryStore`, `JSONFileStore`).
"""

from gazette.consumer.app import Application, Progress, Shard
from gazette.consumer.checkpoint import Checkpoint
from gazette.consumer.runner import ShardRunner, SourceError
from gazette.consumer.store import JSONFileStore, MemoryStore, Store

__all__ = [
    "Application",
    "Checkpoint",
    "JSONFileStore",
    "MemoryStore",
    "Progress",
    "Shard",
    "ShardRunner",
    "SourceError",
    "Store",
]
