"""The application API: what a consumer application supplies (the shard it gets is
`gazette.consumer.app_shard`'s `Shard`).

An application subclasses `Application` and overrides `consume_message` (called for each
read-committed message of the shard's sources, inside a transaction) and, usually,
`finalize_txn` (the transaction closes: flush aggregates into the store, publish). Both
may be plain functions or coroutines. `new_store` gives each shard its store (in memory by
default); `message_type` the message type of a source journal (by default, what the
journal's framing decodes: a dict for JSON lines).

What a transaction gathers outside the store belongs in `shard.txn` (made by `txn_state`
when each transaction begins), never in the application object keyed by shard: a
transaction abandoned before `finalize_txn` (a failed read, a cancelled run) is read
again from the checkpoint, and its leftovers would be counted twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gazette.consumer.app_services import AppServices
from gazette.consumer.app_shard import Shard
from gazette.consumer.store import MemoryStore, Store
from gazette.message import Envelope, Publisher
from gazette.protocol import JournalSpec


class Application:
    """Base of consumer applications: override what you need."""

    def new_store(self, shard: Shard) -> Store:
        """The store of `shard` (called once each time the shard starts here)."""
        return MemoryStore()

    def message_type(self, journal: JournalSpec) -> Any:
        """The message type to decode `journal` into (None: the framing's default)."""
        return None

    def read_source(self, shard: Shard, journal: str, offset: int,
                    batches: AsyncIterator[list[Envelope]]) -> AsyncIterator[list[Envelope]]:
        """The messages of source `journal` from `offset` (Gazette's MessageProducer):
        `batches` are those read from the journal, read-uncommitted; return them as they
        are (the default), filtered or changed, or messages of your own. Each envelope's
        ``end`` is the offset a checkpoint records as read through; they go on through
        the Sequencer (read-committed) to `consume_message`."""
        return batches

    def txn_state(self, shard: Shard) -> Any:
        """What a transaction gathers outside the store (`shard.txn`), new for each
        transaction before `begin_txn`: a dict unless overridden."""
        return {}

    def begin_txn(self, shard: Shard, store: Any) -> Any:
        """A transaction begins (a message is ready)."""

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> Any:
        """One read-committed message, within the open transaction."""
        raise NotImplementedError(f"{type(self).__name__} must define consume_message")

    def finalize_txn(self, shard: Shard, store: Any, publisher: Publisher) -> Any:
        """The transaction closes: write what it aggregated into `store`, publish."""

    def finished_txn(self, shard: Shard, store: Any, committed: asyncio.Future[None]
                     ) -> Any:
        """The transaction's commit has started; `committed` resolves when it is done."""

    def register(self, services: AppServices) -> None:
        """A member starts: add the application's own gRPC methods (routed to a shard's
        primary: `AppServices.add_shard_method`) and HTTP routes."""
