"""Broadcast: every process gets every event of a topic from the time it subscribes
(cache invalidation), with no group, no checkpoint and no shards. A process reads each
partition journal of the topic from its write head, read-committed, and hands each event
to its subscriptions of that topic, which come and go at run time (`Subscription.close`)
and may filter by key (`keys`, changed at run time with `add_keys` / `remove_keys`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from gazette.client import JournalClient
from gazette.events import metrics
from gazette.events.catalog import Catalog
from gazette.events.handlers import Handler, Item, dispatch
from gazette.events.topic import Topic
from gazette.message import (
    Envelope,
    ProducerState,
    Sequencer,
    drain,
    framing_for,
    read_uncommitted,
)

log = logging.getLogger("gazette.events")

#: Backoff of a broadcast reader whose read failed: first wait, and the most.
RESTART_INITIAL, RESTART_MAX = 0.5, 30.0


class Subscription:
    """One broadcast handler, subscribed until `close`."""

    def __init__(self, handler: Handler, keys: set[str] | None,
                 owner: Broadcaster) -> None:
        self.handler, self.keys, self._owner = handler, keys, owner
        self.closed = False

    def add_keys(self, *keys: str) -> None:
        """Receive events of these keys too (a subscription to every key stays so)."""
        if self.keys is not None:
            self.keys.update(keys)

    def remove_keys(self, *keys: str) -> None:
        if self.keys is not None:
            self.keys.difference_update(keys)

    def wants(self, item: Item) -> bool:
        return self.keys is None or item.raw.get("key") in self.keys

    async def close(self) -> None:
        """Opt out: no event is handed to it after this returns."""
        self.closed = True
        self._owner.remove(self)


class Broadcaster:
    """The broadcast readers of one process, one per partition journal of each topic
    subscribed to."""

    def __init__(self, client: JournalClient, catalog: Catalog) -> None:
        self.client, self.catalog = client, catalog
        self._subs: dict[str, list[Subscription]] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._started: dict[str, asyncio.Event] = {}

    async def subscribe(self, topic: Topic[Any], handler: Handler,
                        keys: set[str] | None = None) -> Subscription:
        """Subscribe `handler`; events appended after this returns reach it."""
        sub = Subscription(handler, None if keys is None else set(keys), self)
        subs = self._subs.setdefault(topic.name, [])
        subs.append(sub)
        try:
            for part in (await self.catalog.partitions(topic)).current():
                if part.journal not in self._readers:
                    started = self._started[part.journal] = asyncio.Event()
                    self._readers[part.journal] = asyncio.create_task(
                        self._read(topic, part.journal, started),
                        name=f"broadcast {part.journal}")
                await self._started[part.journal].wait()
        except BaseException:
            subs.remove(sub)
            raise
        return sub

    def remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.handler.topic.name, [])
        if sub in subs:
            subs.remove(sub)

    async def close(self) -> None:
        tasks = list(self._readers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._readers.clear()

    async def _read(self, topic: Topic[Any], journal: str, started: asyncio.Event) -> None:
        """Read `journal` from its write head for ever, restarting after failures from
        where the last whole batch left off: its end, and the Sequencer's producer
        states then (as a shard's checkpoint has them), so that messages a producer had
        pending before that point are delivered at their ACK, and nothing twice."""
        framing = framing_for("application/x-ndjson")
        offset = -1
        states: list[ProducerState] = []
        delay = RESTART_INITIAL
        while True:
            try:
                if offset == -1:
                    async with asyncio.timeout(30):
                        offset = await self.client.write_head(journal)
                    started.set()
                sequencer = Sequencer(states)
                replay = self._replay(journal)
                async with contextlib.aclosing(
                        self.client.read(journal, offset, block=True)) as chunks:
                    async for batch in read_uncommitted(
                            journal, self._contents(journal, chunks), framing, offset):
                        sequencer.queue_all(batch)
                        committed = await drain(sequencer, replay)
                        if committed:
                            await self._deliver(topic, committed)
                        offset, states = batch[-1].end, sequencer.producer_states()
                        delay = RESTART_INITIAL
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - transient: read again, from where we were
                log.warning("broadcast reader of %s failed (again in %.1f s): %s: %s",
                            journal, delay, type(err).__name__, err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESTART_MAX)

    async def _contents(self, journal: str, chunks: AsyncIterator[Any]
                        ) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            metrics.BROADCAST_LAG.labels(journal).set(max(0, chunk.write_head - chunk.end))
            yield chunk.content

    def _replay(self, journal: str) -> Any:
        framing = framing_for("application/x-ndjson")

        async def replay(journal: str, begin: int, end: int) -> AsyncIterator[list[Envelope]]:
            async with contextlib.aclosing(
                    self.client.read(journal, begin, end_offset=end)) as chunks:
                async for batch in read_uncommitted(
                        journal, (bytes(c.content) async for c in chunks), framing, begin):
                    yield batch
        return replay

    async def _deliver(self, topic: Topic[Any], batch: list[Envelope]) -> None:
        items = [Item(env.message, env.journal, env.begin) for env in batch]
        for sub in list(self._subs.get(topic.name, [])):
            if sub.closed:
                continue
            mine = [it for it in items if sub.wants(it)]
            if mine:
                await dispatch("", sub.handler, mine)
