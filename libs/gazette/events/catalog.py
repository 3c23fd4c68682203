"""Where topics live: finding (and, on first use, creating) a topic's partition
journals, and a group's retry and dead-letter journals, through the brokers."""

from __future__ import annotations

import asyncio
import logging
import posixpath
from dataclasses import dataclass
from typing import Any

from gazette.client import ApplyConflict, JournalClient
from gazette.errors import GazetteError
from gazette.events.topic import (
    DEAD,
    DEFAULT_PREFIX,
    RETRY,
    TOPIC_LABEL,
    Topic,
    TopicNotRegistered,
    group_journal_spec,
    partition_specs,
)
from gazette.keyspace.specs import MAX_TXN_OPS
from gazette.message import Partition, StaticPartitions
from gazette.protocol import JournalSpec, SpecChange

log = logging.getLogger("gazette.events")

#: Seconds a listing or an apply may take.
CATALOG_TIMEOUT = 30.0
#: How soon a catalog lists a topic again while the broker catches up with its creation.
LIST_AGAIN_SECONDS = 0.02


@dataclass
class Catalog:
    """Topics' journals, as the brokers at `client` know them. With `create`, a topic
    without journals gets them on first use (`Topic.partitions` of them)."""

    client: JournalClient
    prefix: str = DEFAULT_PREFIX
    replication: int = 1
    fragment_store: str = "file:///"
    create: bool = True

    def __post_init__(self) -> None:
        self._partitions: dict[str, StaticPartitions] = {}
        self._lock = asyncio.Lock()

    async def partitions(self, topic: Topic[Any]) -> StaticPartitions:
        """The partition journals of `topic` (listed once, then cached)."""
        found = self._partitions.get(topic.name)
        if found is not None:
            return found
        async with self._lock:
            found = self._partitions.get(topic.name)
            if found is None:
                specs = await self._list(topic)
                if not specs:
                    specs = await self._create(topic)
                found = self._partitions[topic.name] = StaticPartitions(specs, topic.selector)
            return found

    async def _list(self, topic: Topic[Any]) -> list[JournalSpec]:
        async with asyncio.timeout(CATALOG_TIMEOUT):
            listing = await self.client.list(topic.selector)
        return [j.spec for j in listing.journals]

    async def _create(self, topic: Topic[Any]) -> list[JournalSpec]:
        if not self.create:
            raise TopicNotRegistered(
                f"topic {topic.name} has no journals (none labeled {TOPIC_LABEL}="
                f"{topic.name}) and creating topics is off here: create it with "
                f"`gazctl events create-topic {topic.name} --partitions {topic.partitions}`")
        specs = partition_specs(topic.name, topic.partitions, prefix=self.prefix,
                                replication=self.replication,
                                fragment_store=self.fragment_store)
        await self.ensure(specs)
        log.info("topic %s created: %d partitions under %s%s/", topic.name, len(specs),
                 self.prefix, topic.name)
        # The broker lists from its view of etcd, which may not have reached the apply
        # yet (producing then found no partitions: docs/events.md's example, now and
        # then): list until every partition is there.
        names = {s.name for s in specs}
        async with asyncio.timeout(CATALOG_TIMEOUT):
            while True:
                listed = await self._list(topic)
                if names <= {s.name for s in listed}:
                    return listed
                await asyncio.sleep(LIST_AGAIN_SECONDS)

    async def ensure(self, specs: list[JournalSpec]) -> list[str]:
        """Make the journals of `specs` that do not exist yet, in batches of one etcd
        transaction; another process making them at the same time is fine. Returns the
        names this call made."""
        folder = posixpath.commonpath([s.name.rpartition("/")[0] for s in specs]) + "/"
        made: list[str] = []
        async with asyncio.timeout(CATALOG_TIMEOUT):
            for _ in range(5):
                listing = await self.client.list(f"prefix={folder}")
                existing = {j.spec.name for j in listing.journals}
                missing = [SpecChange(s.name, 0, s) for s in specs if s.name not in existing]
                try:
                    for i in range(0, len(missing), MAX_TXN_OPS):
                        batch = missing[i:i + MAX_TXN_OPS]
                        await self.client.apply(batch)
                        made += [c.name for c in batch]
                    return made
                except ApplyConflict:  # made meanwhile by another process: look again
                    continue
        raise GazetteError(f"journals under {folder} kept changing while being made")

    async def ensure_group(self, topic: Topic[Any], group: str) -> None:
        """Make the retry and dead-letter journals of `topic` in `group`."""
        await self.ensure([group_journal_spec(topic.name, group, role, prefix=self.prefix,
                                              replication=self.replication,
                                              fragment_store=self.fragment_store)
                           for role in (RETRY, DEAD)])


def to_journal(journal: str) -> Any:
    """A mapping that sends every message to `journal` (ndjson)."""
    part = Partition(journal, "application/x-ndjson")
    return lambda msg: part
