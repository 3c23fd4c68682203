"""One live cluster per test module, with authorization on (every call needs a token
signed with the cluster's key): two brokers in two zones, two consumer members of the
counting application (four shards, each with a primary and a hot standby), an events
group whose handler saved a dead letter, and consoles holding a writing token, a
read-only token and none. And one headless Chromium (Debian's, never downloaded)."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gazette.auth import Capability, ClientAuth
from gazette.client import JournalClient
from gazette.console import Console, ConsoleConfig
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.events import Event, Events, OnFailure, Topic
from gazette.keyspace import Etcd, Layout, apply_changes
from gazette.protocol import ShardSource, ShardSpec, SpecChange
from gazette_broker import BrokerServer
from tests.fixtures.broker import broker_config
from tests.fixtures.consumer import INPUTS, SHARDS, Stores
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.events import Order, committed_lines, new_events
from tests.fixtures.polling import eventually
from tests.fixtures.security import keys_file, random_key, token

CHROMIUM = "/usr/bin/chromium"
#: Without the background-networking flags, Chromium's own connections are refused by
#: this machine's closed network (and slow its start).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
#: Screenshots go to docs/images only when asked (CI must not rewrite tracked files).
SCREENSHOTS = os.environ.get("GAZETTE_CONSOLE_SCREENSHOTS", "") == "1"
IMAGES = Path(__file__).resolve().parents[3] / "docs" / "images"

JOURNALS = """
name: console/
replication: 2
labels:
  - {name: console.example/team, value: blue}
fragment:
  stores: ["file:///"]
  length: 262144
children:
  - name: console/orders
    labels: [{name: content-type, value: application/x-ndjson}]
  - name: console/many
    labels: [{name: content-type, value: application/x-ndjson}]
  - name: console/hostile
    replication: 1
    labels: [{name: content-type, value: application/x-ndjson}]
  - name: console/raw
    replication: 1
    labels: [{name: content-type, value: application/octet-stream}]
"""
APP = "counter"
GROUP = "billing"
ORDERS = Topic("orders", Order, partitions=2)
WRITER = (Capability.LIST, Capability.READ, Capability.APPEND, Capability.SHARD_LIST,
          Capability.SHARD_READ)
READER = (Capability.LIST, Capability.READ, Capability.SHARD_LIST, Capability.SHARD_READ)


@dataclass
class Cluster:
    etcd: EtcdServer
    prefix: str
    consumer_root: str
    key: bytes
    brokers: list[BrokerServer]
    members: list[ConsumerMember]
    events: Events
    client: JournalClient
    #: Consoles by the token they hold: "writer", "reader", "none".
    consoles: dict[str, Console] = field(default_factory=dict)
    #: Events the handler saw (id, attempt).
    seen: list[tuple[int, int]] = field(default_factory=list)

    def url(self, console: str, path: str) -> str:
        return self.consoles[console].url.rstrip("/") + path

    def console_config(self, *capabilities: Capability, **overrides: Any) -> ConsoleConfig:
        values: dict[str, Any] = dict(
            port=0, broker_address=self.brokers[0].grpc_address,
            consumer_address=self.members[0].endpoint, etcd_address=self.etcd.endpoint,
            etcd_prefix=self.prefix, consumer_etcd_prefix=self.consumer_root, timeout=8.0,
            auth_token=token(self.key, *capabilities, subject="console", ttl=3600)
            if capabilities else "")
        values.update(overrides)
        return ConsoleConfig(**values)


def consumer_member(etcd: EtcdServer, root: str, broker: BrokerServer, stores: Stores,
                    name: str, zone: str, keys: str) -> ConsumerMember:
    return ConsumerMember(MemberConfig(
        APP, zone=zone, suffix=name, host="127.0.0.1", bind="127.0.0.1", port=0,
        http_port=0, broker_address=broker.grpc_address, etcd_address=etcd.endpoint,
        etcd_root=root, lease_ttl=5, drain_timeout=5, grace=1, auth_keys_file=keys),
        stores.app())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Cluster]:
    work = tmp_path_factory.mktemp("console")
    key = random_key()
    keys = keys_file(work / "keys", key)
    prefix = f"/test-{uuid.uuid4().hex[:8]}/gazette"
    root = prefix.rsplit("/", 1)[0] + "/consumers"
    async with contextlib.AsyncExitStack() as stack:
        brokers = []
        for i, zone in enumerate(("zone-a", "zone-b")):
            broker = BrokerServer(broker_config(
                etcd_server.endpoint, prefix, work, zone=zone, suffix=f"broker-{i}",
                spool_dir=work / f"spools-{i}", auth_keys_file=keys, drain_timeout=5.0))
            await broker.start()
            stack.push_async_callback(broker.stop)
            brokers.append(broker)
        await brokers[0].apply_yaml(JOURNALS + "---\n" + INPUTS)
        client = JournalClient(brokers[0].grpc_address,
                               auth=ClientAuth(token=token(key, *Capability, ttl=3600)))
        stack.push_async_callback(client.close)

        stores = Stores()
        members = []
        for i, zone in enumerate(("zone-a", "zone-b")):
            member = consumer_member(etcd_server, root, brokers[0], stores, f"member-{i}",
                                     zone, keys)
            await member.start()
            stack.push_async_callback(member.stop)
            members.append(member)
        async with Etcd(etcd_server.endpoint) as etcd:
            await apply_changes(etcd, Layout.consumer_app(APP, root), [
                SpecChange(s, 0, ShardSpec(s, (ShardSource(f"counts/in-{i}"),),
                                           hot_standbys=1))
                for i, s in enumerate(SHARDS)])

        events = new_events(brokers[0], etcd_server, root, member={"auth_keys_file": keys})
        seen: list[tuple[int, int]] = []
        refuse = {3}

        async def ship(event: Event[Order]) -> None:
            if event.payload.id in refuse:
                refuse.discard(event.payload.id)  # once: a replay then goes through
                raise RuntimeError("warehouse <b>closed</b>")
            seen.append((event.payload.id, event.attempt))

        events.idempotent(GROUP, ORDERS, ship, on_failure=OnFailure.SAVE)
        await events.start()
        stack.push_async_callback(events.stop)
        await events.produce(ORDERS, *(Order(id=i, customer=f"c{i % 3}") for i in range(6)))

        found = Cluster(etcd_server, prefix, root, key, brokers, members, events, client,
                        seen=seen)
        for name, caps in (("writer", WRITER), ("reader", READER), ("none", ())):
            console = Console(found.console_config(*caps))
            await console.start()
            stack.push_async_callback(console.stop)
            found.consoles[name] = console

        async def ready() -> bool:
            dead = await committed_lines(client, "events/orders/dead/billing")
            return bool(dead) and len(seen) == 5 and all(
                standby_ready(m, s) for m in members for s in SHARDS)

        await eventually(ready, "a dead letter saved, the other events handled, every "
                         "shard with a primary and a standby", timeout=30)
        yield found


def standby_ready(member: ConsumerMember, shard: str) -> bool:
    status = member.status(shard)
    return status is not None and status.state.name in ("PRIMARY", "STANDBY")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    """Debian's Chromium, headless, through Playwright (no browser is downloaded)."""
    if shutil.which(CHROMIUM) is None:  # (missing, or not executable)
        pytest.fail(f"no Chromium at {CHROMIUM}: run scripts/ensure-system-deps.sh (it "
                    "installs Debian's chromium)", pytrace=False)
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Any) -> AsyncIterator[Any]:
    """A fresh page of 1200 x 800 (the screenshots' size)."""
    context = await browser.new_context(viewport={"width": 1200, "height": 800})
    page = await context.new_page()
    try:
        yield page
    finally:
        await context.close()


async def screenshot(page: Any, name: str) -> None:
    """docs/images/console-<name>.png of what `page` shows, with
    GAZETTE_CONSOLE_SCREENSHOTS=1."""
    if SCREENSHOTS:
        IMAGES.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(IMAGES / f"console-{name}.png"))
