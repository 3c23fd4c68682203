"""`Events`: one object per process to produce and consume typed topics."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from gazette.auth import Capability, ClientAuth, MemberSecurity, SecurityConfig
from gazette.client import AppendQueue, JournalClient
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.errors import ValidationError
from gazette.events import metrics
from gazette.events.broadcast import Broadcaster, Subscription
from gazette.events.catalog import Catalog
from gazette.events.group import Group, app_name, ensure_group, new_member
from gazette.events.handlers import Handler, Kind, OnFailure
from gazette.events.outbox import CLAIM, CatchUp, OutboxTx, Row, ensure_schema, message_of
from gazette.events.outbox import publish_claimed as _publish_claimed
from gazette.events.topic import DEFAULT_PREFIX, Topic, TopicNotRegistered, validate_name
from gazette.message import Publisher, rendezvous_mapping
from gazette.message.mapping import MappingFunc
from gazette.supervise import Supervisor

log = logging.getLogger("gazette.events")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
#: Seconds an append of produced events may take to be acknowledged.
PRODUCE_TIMEOUT = 30.0
#: What the token an `Events` with the signing keys issues itself grants: making topics'
#: journals (list, apply), producing and reading them.
PRODUCER_CAPABILITIES = frozenset({Capability.LIST, Capability.APPLY, Capability.READ,
                                   Capability.APPEND})
#: `MemberConfig` fields an `Events` sets itself, not from its `member` options.
_SET_BY_EVENTS = frozenset({"app_name", "broker_address", "etcd_address"})


class EventsTx:
    """The open transaction of `Events.transaction`: run your statements on
    `connection`; `produce` events that are published if, and once, it commits."""

    def __init__(self, events: Events, outbox: OutboxTx) -> None:
        self._events, self._outbox = events, outbox
        self.connection = outbox.connection

    def produce(self, topic: Topic[Any], *payloads: Any) -> None:
        """Add events to this transaction (raises at once for a wrong type)."""
        self._events._check(topic)
        for payload in payloads:
            self._outbox.add(topic.name, topic.new_line(payload))


class Events:
    """Produce and consume typed topics over journals.

    `broker_address` and `etcd_address` locate the cluster; `dsn` is the application's
    PostgreSQL database (needed for `transaction` and exactly-once handlers; without it,
    groups keep their checkpoints on recovery logs). With `require_registration`, only
    topics given to `register` may be used. With `create_topics` off, a topic without
    journals is an error instead of being created. `member` sets options of the group
    members this process runs (`MemberConfig` fields: ``host``, ``port``, ``zone``,
    ``lease_ttl``..., and the security ones: ``tls_cert_file``, ``auth_keys_file`` or
    ``auth_token``, ``etcd_ca_file``...). `auth` is how this process produces and
    reads; by default, as its members call brokers (with their TLS files and their own
    token), or in plain text if they have no security options."""

    def __init__(self, *, broker_address: str = "localhost:8080",
                 etcd_address: str = "http://localhost:2379", dsn: str | None = None,
                 require_registration: bool = False, create_topics: bool = True,
                 prefix: str = DEFAULT_PREFIX, replication: int = 1,
                 fragment_store: str = "file:///", member: Mapping[str, Any] | None = None,
                 catch_up: bool = True, catch_up_interval: float = 5.0,
                 catch_up_min_age: float = 5.0, auth: ClientAuth | None = None) -> None:
        if not prefix.endswith("/"):
            raise ValidationError("prefix", f"must end with '/', got {prefix!r}")
        self.broker_address, self.etcd_address, self.dsn = broker_address, etcd_address, dsn
        self.require_registration = require_registration
        self._create, self._prefix = create_topics, prefix
        self._replication, self._fragment_store = replication, fragment_store
        self._member_options = dict(member or {})
        known = {f.name for f in dataclasses.fields(MemberConfig)} - _SET_BY_EVENTS
        unknown = sorted(set(self._member_options) - known)
        if unknown:
            raise ValidationError("member", f"unknown option {unknown[0]!r} (known: "
                                  f"{', '.join(sorted(known))})")
        self._auth = auth
        self._catch_up = (CatchUp(dsn, self._publish_rows, interval=catch_up_interval,
                                  min_age=catch_up_min_age) if dsn is not None else None)
        self._run_catch_up = catch_up
        self.topics: dict[str, Topic[Any]] = {}
        self.groups: dict[str, Group] = {}
        self._broadcasts: list[tuple[Handler, set[str] | None]] = []
        self.members: dict[str, ConsumerMember] = {}
        self.subscriptions: list[Subscription] = []
        self._mappings: dict[str, MappingFunc] = {}
        self._client: JournalClient | None = None
        self._appender: AppendQueue | None = None
        self._publisher: Publisher | None = None
        self._catalog: Catalog | None = None
        self._broadcaster: Broadcaster | None = None
        self._supervisor = Supervisor(transient=(Exception,))
        self._started = False

    # -- topics ---------------------------------------------------------------------

    def register(self, topic: Topic[Any]) -> Topic[Any]:
        """Allow `topic` here (needed only with `require_registration`)."""
        known = self.topics.get(topic.name)
        if known is not None and known != topic:
            raise ValidationError(f"topic {topic.name}", "is registered with another model")
        self.topics[topic.name] = topic
        return topic

    def _check(self, topic: Topic[Any]) -> None:
        """Refuse an unregistered topic where registration is required; otherwise a
        topic is registered by its first use (the outbox publishes by name)."""
        if self.require_registration and self.topics.get(topic.name) != topic:
            raise TopicNotRegistered(f"topic {topic.name} is not registered: call "
                                     "Events.register(topic) first")
        self.topics.setdefault(topic.name, topic)

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            raise RuntimeError("Events: start() first (or use `async with events:`)")
        return self._catalog

    async def _mapping(self, topic: Topic[Any]) -> MappingFunc:
        mapping = self._mappings.get(topic.name)
        if mapping is None:
            partitions = await self.catalog.partitions(topic)
            mapping = self._mappings[topic.name] = rendezvous_mapping(
                lambda m: m["key"].encode(), partitions)
        return mapping

    # -- producing ------------------------------------------------------------------

    async def produce(self, topic: Topic[Any], *payloads: Any,
                      event_ids: Sequence[str] | None = None) -> None:
        """Append events of `topic` and wait until they are acknowledged (at least
        once: an append in doubt is sent again, and readers drop the repeat).
        `event_ids` name the events (default: new random ids); an event produced again
        with the same id is one that exactly-once handlers process once."""
        self._check(topic)
        if event_ids is not None and len(event_ids) != len(payloads):
            raise ValidationError("event_ids", f"{len(event_ids)} ids for "
                                  f"{len(payloads)} payloads")
        mapping = await self._mapping(topic)
        assert self._publisher is not None, "start() first"
        publish, line = self._publisher.publish_committed, topic.new_line
        appends = [publish(mapping, line(p, event_id=event_ids[i] if event_ids else ""))
                   for i, p in enumerate(payloads)]
        async with asyncio.timeout(PRODUCE_TIMEOUT):
            await asyncio.gather(*appends)
        metrics.PRODUCED.labels(topic.name, "direct").inc(len(payloads))

    @contextlib.asynccontextmanager
    async def transaction(self, connection: Any) -> AsyncIterator[EventsTx]:
        """A transaction of `connection` (a psycopg 3 AsyncConnection, not already in a
        transaction) whose `produce`d events are published once it commits, and never if
        it rolls back. A crash after the commit leaves them to the catch-up producer."""
        from psycopg.pq import TransactionStatus

        if self.dsn is None:
            raise ValidationError("dsn", "Events.transaction needs the database (dsn=...)")
        if connection.info.transaction_status != TransactionStatus.IDLE:
            raise ValidationError("connection", (
                "is already in a transaction: Events.transaction must own the commit "
                "(commit or roll back first)"))
        outbox = OutboxTx(connection)
        async with connection.transaction():
            yield EventsTx(self, outbox)
            await outbox.flush()
        if outbox.ids:
            try:
                await _publish_claimed(connection, CLAIM, (outbox.ids,), self._publish_rows,
                                       "outbox")
            except Exception as err:  # noqa: BLE001 - committed: the catch-up sends them
                log.warning("outbox: %d event(s) committed but not published yet (the "
                            "catch-up producer will send them): %s: %s", len(outbox.ids),
                            type(err).__name__, err)

    async def _publish_rows(self, rows: Sequence[Row], path: str) -> None:
        assert self._publisher is not None, "start() first"
        publish = self._publisher.publish_committed
        appends = []
        for row in rows:
            topic = self.topics.get(row[0]) or Topic(row[0], dict)
            appends.append(publish(await self._mapping(topic), message_of(row)))
        await asyncio.gather(*appends)
        for row in rows:
            metrics.PRODUCED.labels(row[0], path).inc()

    async def catch_up_now(self) -> int:
        """Sweep the outbox once now (what the catch-up producer does every interval);
        returns how many events it published."""
        if self._catch_up is None:
            raise ValidationError("dsn", "the catch-up producer needs the database (dsn=...)")
        from gazette.events.outbox import connect

        async with await connect(self._catch_up.dsn) as conn:
            return await self._catch_up.sweep(conn)

    # -- consuming ------------------------------------------------------------------

    def _handler(self, kind: Kind, group: str, topic: Topic[Any], fn: F | None,
                 name: str | None, options: dict[str, Any]) -> Any:
        def add(fn: F) -> F:
            if self._started:
                raise RuntimeError("add group handlers before start(); broadcast "
                                   "handlers can come and go with subscribe()")
            self._check(topic)
            if kind is not Kind.BROADCAST:
                validate_name(group, "group")
            keys = options.pop("keys", None)
            handler = Handler(name or fn.__name__, topic, fn, kind, **options)
            if kind is Kind.BROADCAST:
                self._broadcasts.append((handler, keys))
            else:
                if kind is Kind.EXACTLY_ONCE and self.dsn is None:
                    raise ValidationError("dsn", "exactly-once handlers need the database")
                self.groups.setdefault(group, Group(group)).add(handler)
            return fn
        return add(fn) if fn is not None else add

    def idempotent(self, group: str, topic: Topic[Any], fn: F | None = None, *,
                   name: str | None = None, on_failure: OnFailure = OnFailure.DISCARD,
                   **options: Any) -> Any:
        """Handle `topic` in `group`, at least once: ``async def fn(event)`` (or a list
        of events with ``batch_size=``). Usable as a decorator."""
        return self._handler(Kind.IDEMPOTENT, group, topic, fn, name,
                             {"on_failure": on_failure, **options})

    def exactly_once(self, group: str, topic: Topic[Any], fn: F | None = None, *,
                     name: str | None = None, on_failure: OnFailure = OnFailure.DISCARD,
                     **options: Any) -> Any:
        """Handle `topic` in `group` exactly once: ``async def fn(tx, event)``, `tx` the
        database connection in the group's transaction; what `fn` writes with it
        commits if and only if the event counts as processed. Usable as a decorator."""
        return self._handler(Kind.EXACTLY_ONCE, group, topic, fn, name,
                             {"on_failure": on_failure, **options})

    def broadcast(self, topic: Topic[Any], fn: F | None = None, *, name: str | None = None,
                  on_failure: OnFailure = OnFailure.DISCARD, **options: Any) -> Any:
        """Handle every event of `topic` appended after start, in this process (and in
        every other one that does the same). Usable as a decorator."""
        return self._handler(Kind.BROADCAST, "", topic, fn, name,
                             {"on_failure": on_failure, **options})

    async def subscribe(self, topic: Topic[Any], fn: Callable[..., Awaitable[Any]], *,
                        name: str | None = None, keys: set[str] | None = None,
                        on_failure: OnFailure = OnFailure.DISCARD, **options: Any
                        ) -> Subscription:
        """Opt in at run time to broadcast events of `topic` (only of `keys`, if given)
        from now on; `await subscription.close()` opts out."""
        self._check(topic)
        if self._broadcaster is None:
            raise RuntimeError("Events: start() first")
        handler = Handler(name or str(getattr(fn, "__name__", "handler")), topic, fn,
                          Kind.BROADCAST, on_failure=on_failure, **options)
        sub = await self._broadcaster.subscribe(topic, handler, keys)
        self.subscriptions.append(sub)
        return sub

    # -- running --------------------------------------------------------------------

    async def start(self) -> None:
        """Connect; make the tables; join the groups (one consumer member each);
        subscribe the broadcast handlers; start the catch-up producer."""
        self._client = JournalClient(self.broker_address, auth=self._client_auth())
        self._appender = AppendQueue(self._client, resend=True)
        self._publisher = Publisher(self._appender)
        self._catalog = Catalog(self._client, self._prefix, self._replication,
                                self._fragment_store, self._create)
        self._broadcaster = Broadcaster(self._client, self._catalog)
        self._started = True
        try:
            if self.dsn is not None:
                await ensure_schema(self.dsn)
            for group in self.groups.values():
                await self._join(group)
            for handler, keys in self._broadcasts:
                self.subscriptions.append(
                    await self._broadcaster.subscribe(handler.topic, handler, keys))
            if self._catch_up is not None and self._run_catch_up:
                self._supervisor.spawn("outbox catch-up", self._catch_up.run)
        except BaseException:
            await self.stop()
            raise

    def _client_auth(self) -> ClientAuth | None:
        if self._auth is not None:
            return self._auth
        fields = {f.name for f in dataclasses.fields(SecurityConfig)}
        options = {k: v for k, v in self._member_options.items() if k in fields}
        if not options:
            return None
        security = MemberSecurity(SecurityConfig(**options), "events producer",
                                  PRODUCER_CAPABILITIES, {})
        return security.client_auth()

    async def _join(self, group: Group) -> None:
        options = {"port": 0, "http_port": -1, **self._member_options}
        config = MemberConfig(app_name=app_name(group.name), broker_address=self.broker_address,
                              etcd_address=self.etcd_address, **options)
        member = self.members[group.name] = new_member(config, group, dsn=self.dsn,
                                                       prefix=self._prefix)
        await member.start()
        await ensure_group(self.catalog, member.etcd, config.etcd_root, group,
                           recovery_logs=self.dsn is None)

    async def wait(self) -> None:
        """Return only when this process can no longer consume (a member lost its
        lease, or a task failed for good): raises why."""
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(m.wait())
                                            for m in self.members.values()]
        waits.append(asyncio.ensure_future(self._supervisor.failed.wait()))
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                fut.result()
            if self._supervisor.failure is not None:
                raise self._supervisor.failure
        finally:
            for fut in waits:
                fut.cancel()

    async def stop(self) -> None:
        """Drain the groups' shards to other members, stop reading, flush appends."""
        if not self._started:
            return
        self._started = False
        for member in self.members.values():
            await member.stop()
        self.members.clear()
        if self._broadcaster is not None:
            await self._broadcaster.close()
        self.subscriptions.clear()
        await self._supervisor.close()
        self._supervisor = Supervisor(transient=(Exception,))
        if self._appender is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PRODUCE_TIMEOUT):
                    await self._appender.close()
        if self._client is not None:
            await self._client.close()
        self._mappings.clear()

    async def __aenter__(self) -> Events:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
