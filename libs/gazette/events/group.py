"""Consumer groups on the consumer framework: a group is a consumer application whose
shards are its topics' partition journals (plus one shard per topic for its retry
journal); every process running the group is a member, and the allocator spreads the
shards over them. Each shard reads its journal read-committed in transactions; a
transaction's events go to the group's handlers of that topic when it closes, and its
checkpoint commits afterwards, so:

- idempotent handlers see each event at least once (again only after a crash), and
  never an append's repeat (the Sequencer drops it);
- exactly-once handlers run in the shard's database transaction (`SQLStore`): their
  writes, the processed-event records and the checkpoint commit together or not at all;
- failures routed to the retry or dead-letter journal are published within the same
  transaction, committed with it.

A new group has no checkpoint: it starts at the beginning of each journal. A group's
checkpoints live in PostgreSQL when the library has a database, and otherwise in a JSON
file on a recovery log per shard (``<prefix>_logs/<group>/<shard>``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from gazette.consumer import Application, JSONFileStore, Shard, Store
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.events import metrics
from gazette.events.catalog import Catalog, to_journal
from gazette.events.handlers import Handler, Item, Kind, dispatch
from gazette.events.outbox import PROCESSED
from gazette.events.topic import (
    DEAD,
    RETRY,
    Topic,
    failed_line,
    group_journal,
    journal_spec,
)
from gazette.keyspace import Etcd, Layout, TxnConflict, apply_changes
from gazette.labels import LabelSet
from gazette.message import Envelope, Publisher
from gazette.protocol import ShardSource, ShardSpec, SpecChange

#: Seconds a group's transactions may take to gather events (the consumer default is 1).
MAX_TXN_SECONDS = 1.0


def app_name(group: str) -> str:
    return f"events.{group}"


@dataclass
class Group:
    """Consumer group `name` and its handlers, by topic."""

    name: str
    handlers: dict[str, list[Handler]] = field(default_factory=dict)

    @property
    def topics(self) -> list[Topic[Any]]:
        return [hs[0].topic for hs in self.handlers.values()]

    def add(self, handler: Handler) -> None:
        mine = self.handlers.setdefault(handler.topic.name, [])
        if any(h.name == handler.name for h in mine):
            raise ValueError(f"group {self.name}: topic {handler.topic.name} already has a "
                             f"handler named {handler.name}")
        if mine and mine[0].topic != handler.topic:
            raise ValueError(f"group {self.name}: two different topics are named "
                             f"{handler.topic.name}")
        mine.append(handler)
        metrics.count_handler(self.name, handler.topic.name, handler.name,
                              handler.on_failure.value)


class _Failures:
    """A shard's failed events, published into its group's retry or dead-letter
    journal within the shard's transaction."""

    def __init__(self, publisher: Publisher, group: str, prefix: str) -> None:
        self.publisher, self.group, self.prefix = publisher, group, prefix

    def retry(self, handler: Handler, item: Item, error: str, attempt: int) -> None:
        self._send(RETRY, handler, item, error, attempt,
                   retry_at=time.time() + handler.retry_delay)

    def dead(self, handler: Handler, item: Item, error: str, attempt: int) -> None:
        self._send(DEAD, handler, item, error, attempt)
        metrics.DEAD_LETTERS.labels(self.group, handler.topic.name, handler.name).inc()

    def _send(self, role: str, handler: Handler, item: Item, error: str, attempt: int,
              retry_at: float | None = None) -> None:
        topic = handler.topic.name
        line = failed_line(item.raw, topic=topic, group=self.group, handler=handler.name,
                           attempt=attempt, source=f"{item.journal}@{item.offset}",
                           error=error, retry_at=retry_at)
        journal = group_journal(topic, self.group, role, self.prefix)
        self.publisher.publish_uncommitted(to_journal(journal), line)


class _SqlTx:
    """Exactly-once dispatch within the shard's database transaction: each invocation
    in a savepoint, with its processed-event records."""

    def __init__(self, store: Any, group: str) -> None:
        self.store, self.group = store, group

    @property
    def connection(self) -> Any:
        return self.store.connection

    async def begin(self) -> None:
        await self.store.execute("SAVEPOINT gazette_events")

    async def fresh(self, handler: Handler, ids: list[str]) -> set[str]:
        cur = await self.store.execute(
            f"INSERT INTO {PROCESSED} (grp, handler, event_id) SELECT %s, %s, "
            "unnest(%s::text[]) ON CONFLICT DO NOTHING RETURNING event_id",
            (self.group, handler.name, ids))
        return {r[0] for r in await cur.fetchall()}

    async def commit(self) -> None:
        await self.store.execute("RELEASE SAVEPOINT gazette_events")

    async def rollback(self) -> None:
        await self.store.execute("ROLLBACK TO SAVEPOINT gazette_events")


class GroupApp(Application):
    """The consumer application of a group."""

    def __init__(self, group: Group, *, dsn: str | None, prefix: str) -> None:
        self.group, self.dsn, self.prefix = group, dsn, prefix

    def new_store(self, shard: Shard) -> Store:
        if self.dsn is not None:
            from gazette.consumer.sql import SQLStore

            return SQLStore(self.dsn, f"{app_name(self.group.name)}/{shard.id}")
        if shard.folder is None:
            raise RuntimeError(f"shard {shard.id} has neither a database nor a recovery log")
        return JSONFileStore(shard.folder, "checkpoint.json")

    def txn_state(self, shard: Shard) -> list[Item]:
        """The transaction's events, handled when it closes."""
        return []

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        shard.txn.append(Item(envelope.message, envelope.journal, envelope.begin))

    async def finalize_txn(self, shard: Shard, store: Any, publisher: Publisher) -> None:
        items: list[Item] = shard.txn
        topic, _, part = shard.id.rpartition("/")
        handlers = self.group.handlers.get(topic, [])
        failures = _Failures(publisher, self.group.name, self.prefix)
        retrying = part == RETRY
        if retrying:  # a retry journal's events wait for their time
            due = max((float(it.raw.get("retry_at", 0)) for it in items), default=0)
            if (wait := due - time.time()) > 0:
                await asyncio.sleep(wait)
        for handler in handlers:
            mine = [it for it in items if it.raw.get("handler") == handler.name] \
                if retrying else items
            if not mine:
                continue
            tx = _SqlTx(store, self.group.name) if handler.kind is Kind.EXACTLY_ONCE \
                else None
            await dispatch(self.group.name, handler, mine, failures=failures, tx=tx,
                           stopping=shard.stopping)


def hint_prefix(group: str, etcd_root: str) -> str:
    """Where a group's recovery-log hints live in etcd (beside, not under, the apps)."""
    return f"{etcd_root}/hints/{app_name(group)}"


def log_prefix(group: str, prefix: str) -> str:
    return f"{prefix}_logs/{group}"


async def ensure_group(catalog: Catalog, etcd: Etcd, etcd_root: str, group: Group, *,
                       recovery_logs: bool) -> None:
    """Make the group's journals (retry, dead letters, recovery logs) and its shards,
    where missing."""
    specs: list[ShardSpec] = []
    extra: dict[str, Any] = {"max_txn_duration": timedelta(seconds=MAX_TXN_SECONDS)}
    if recovery_logs:
        extra |= {"recovery_log_prefix": log_prefix(group.name, catalog.prefix),
                  "hint_prefix": hint_prefix(group.name, etcd_root)}
    for topic in group.topics:
        await catalog.ensure_group(topic, group.name)
        sources = [p.journal for p in (await catalog.partitions(topic)).current()]
        specs += [ShardSpec(f"{topic.name}/{journal.rpartition('/')[2]}",
                            (ShardSource(journal),), **extra) for journal in sources]
        specs.append(ShardSpec(f"{topic.name}/{RETRY}", (ShardSource(
            group_journal(topic.name, group.name, RETRY, catalog.prefix)),), **extra))
    if recovery_logs:
        labels = LabelSet([("content-type", "application/octet-stream")])
        await catalog.ensure([journal_spec(f"{log_prefix(group.name, catalog.prefix)}/{s.id}",
                                           labels, catalog.replication, catalog.fragment_store)
                              for s in specs])
    layout = Layout.consumer_app(app_name(group.name), etcd_root)
    for _ in range(5):
        missing = [SpecChange(s.id, 0, s) for s in specs
                   if (await etcd.get(layout.item_key(s.id)))[1] is None]
        if not missing:
            return
        try:
            await apply_changes(etcd, layout, missing)
            return
        except TxnConflict:  # another member made some meanwhile: look again
            continue


def new_member(config: MemberConfig, group: Group, *, dsn: str | None, prefix: str
               ) -> ConsumerMember:
    return ConsumerMember(config, GroupApp(group, dsn=dsn, prefix=prefix))
