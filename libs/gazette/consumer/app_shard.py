"""A shard as its application sees it: `Shard` (its spec, publisher, progress, store
folder and open transaction's state) and its `Progress`.

Apart from `gazette.consumer.app` so that the application's services
(`gazette.consumer.app_services`), which hand a `Shard` to its shard methods, sit below
the `Application` that registers them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gazette.message import Publisher
from gazette.protocol import ShardSpec
from gazette.recoverylog import RecordedFolder


@dataclass
class Progress:
    """How far a shard has come: offsets read through per source journal as of its
    last committed transaction, and counts of transactions and messages."""

    committed: dict[str, int] = field(default_factory=dict)
    transactions: int = 0
    messages: int = 0
    #: Set (and replaced) whenever a transaction commits: `wait_committed` waits on it.
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def restored(self, offsets: dict[str, int]) -> None:
        """The shard starts from a checkpoint through `offsets`."""
        self.committed = dict(offsets)
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def record(self, offsets: dict[str, int], messages: int) -> None:
        """A transaction committed through `offsets`, having consumed `messages`."""
        self.committed = dict(offsets)
        self.transactions += 1
        self.messages += messages
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def wait_committed(self, through: dict[str, int]) -> None:
        """Return once every journal of `through` is committed through its offset."""
        while not all(self.committed.get(j, 0) >= o for j, o in through.items()):
            await self.changed.wait()


@dataclass
class Shard:
    """What an application gets of a shard: its `spec`, the `publisher` its messages go
    through (uncommitted within the transaction, acknowledged once it commits), its
    `progress`, and `stopping` (set when the shard is being stopped here). A member
    makes one for each run of the shard (it starts, or starts again, here)."""

    spec: ShardSpec
    publisher: Publisher
    progress: Progress = field(default_factory=Progress)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    #: With a recovery log: the store's local folder, played from the log and
    #: recorded into it (give it to `SQLiteStore` or `JSONFileStore`).
    folder: RecordedFolder | None = None
    #: The open transaction's own state (`Application.txn_state`), made afresh when each
    #: transaction begins: an abandoned transaction's never reaches the next one.
    txn: Any = None

    @property
    def id(self) -> str:
        return self.spec.id
