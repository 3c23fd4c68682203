"""The cluster layer over a toy item kind (not journals), on a real etcd: items are
assigned to members by the allocator and opened as local objects there, a request to any
member is forwarded to the one that serves its item (or refused with the route under
``do_not_proxy``), and a draining member hands every item to the others.

The toy: items are "counters" stored as JSON under the layout's items; a member answers
``Where`` for an item it serves with its own name and a count of requests it took.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from gazette.allocator import assignments_of
from gazette.cluster import (
    CLOSED_MOVED,
    Announcer,
    Channels,
    LocalItems,
    Membership,
    NotReady,
    Resolution,
    Resolver,
    forward_unary,
)
from gazette.keyspace import Etcd, KeySpace, KeyValue, Layout
from gazette.keyspace.layout import ItemKey, MemberKey
from gazette.keyspace.specs import decode_broker
from gazette.protocol import MemberSpec, ProcessId
from gazette.supervise import Supervisor
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

WHERE = "/toy.Toy/Where"


@dataclass(frozen=True)
class Counter:
    """The toy item's spec."""

    name: str
    replication: int = 1
    #: A counter named here cannot be opened yet (its "store" is down).
    broken: bool = False


def decoder(layout: Layout) -> Any:
    def decode(kv: KeyValue) -> Any:
        key = layout.parse(kv.key)
        if isinstance(key, ItemKey):
            return Counter(**json.loads(kv.value))
        if isinstance(key, MemberKey):
            return decode_broker(kv.value)
        return kv.value
    return decode


class LocalCounter:
    """A counter served here: counts requests; as primary, announces each new route."""

    def __init__(self, spec: Counter, announcer: Announcer, me: ProcessId) -> None:
        self.spec, self.announcer, self.me = spec, announcer, me
        self.count = 0
        self.closed = ""
        self.route: Resolution[Counter] | None = None
        self._changed = asyncio.Event()

    async def run(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            res = self.route
            if res is not None and res.route.primary_id == self.me:
                await self.announcer.announce(self.spec.name, res.route)

    def update_spec(self, spec: Counter) -> None:
        self.spec = spec

    def update_route(self, res: Resolution[Any]) -> None:
        self.route = res
        self._changed.set()

    async def close(self, reason: str) -> None:
        self.closed = reason


class ToyMember:
    """One member serving counters: the cluster layer and a one-method gRPC service."""

    def __init__(self, endpoint: str, prefix: str, name: str, zone: str) -> None:
        self.layout = Layout(prefix)
        self.etcd = Etcd(endpoint)
        self.keyspace: KeySpace[Any] = KeySpace(self.etcd, self.layout.root + "/",
                                                decoder(self.layout))
        self.id = ProcessId(zone, name)
        self.supervisor = Supervisor()
        self.membership = Membership(self.etcd, self.keyspace, self.layout, self.id)
        self.resolver: Resolver[Counter] | None = None
        self.announcer = Announcer(self.etcd, self.keyspace, self.layout)
        self.channels = Channels()
        self.local: LocalItems[Counter, LocalCounter] | None = None
        self.server = grpc.aio.server()
        self.closed: list[LocalCounter] = []

    async def _open(self, spec: Counter) -> LocalCounter:
        if spec.broken:
            raise NotReady(f"counter {spec.name} is not served yet: its store is down")
        counter = LocalCounter(spec, self.announcer, self.id)
        self.closed.append(counter)  # to look at after it closes
        return counter

    async def start(self) -> None:
        handler = grpc.unary_unary_rpc_method_handler(self.where)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("toy.Toy", {"Where": handler}),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        await self.etcd.connect()
        deadline = self.membership.deadline()
        await self.membership.load(deadline)
        self.resolver = Resolver(self.keyspace, self.layout, self.id, Counter)
        self.local = LocalItems(self.keyspace, self.layout, Counter, self._open,
                                self.supervisor, resolver=self.resolver, kind="counter")
        await self.membership.join(MemberSpec(self.id, f"http://127.0.0.1:{port}", 100),
                                   self.supervisor, deadline)
        self.supervisor.spawn("announcer", self.announcer.run)
        await self.local.start()
        self.membership.run_allocator(self.supervisor)

    async def where(self, raw: bytes, context: Any) -> bytes:
        request = json.loads(raw)
        assert self.resolver is not None and self.local is not None
        res = self.resolver.resolve(request["item"])
        counter = self.local.items.get(request["item"])
        if counter is not None and res.route.primary_id == self.id:
            counter.count += 1
            return json.dumps({"served_by": self.id.suffix, "count": counter.count}).encode()
        if request.get("do_not_proxy") or not res.primary_endpoint:
            return json.dumps({"refused": "not the primary here",
                               "primary": res.primary_endpoint}).encode()
        forwarded = json.dumps({**request, "do_not_proxy": True}).encode()
        return await forward_unary(self.channels, res.primary_endpoint, WHERE, forwarded,
                                   lambda b: b, context, f"asking for {request['item']}")

    async def stop(self) -> None:
        assert self.resolver is not None and self.local is not None
        await self.membership.drain(self.resolver.assigned, timeout=20)
        await self.server.stop(grace=1)
        self.resolver.stop()
        await self.local.close("the member is stopping")
        await self.supervisor.close()
        await self.channels.close()
        await self.membership.leave()

    @property
    def endpoint(self) -> str:
        spec = self.membership.spec
        assert spec is not None
        return spec.endpoint


async def ask(member: ToyMember, item: str, **extra: Any) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(member.endpoint.removeprefix("http://")) as ch:
        call = ch.unary_unary(WHERE)
        raw = await call(json.dumps({"item": item, **extra}).encode(), timeout=10)
    return json.loads(raw)  # type: ignore[no-any-return]


@pytest.fixture
async def members(etcd_server: EtcdServer, etcd_prefix: str
                  ) -> AsyncIterator[list[ToyMember]]:
    started: list[ToyMember] = []
    try:
        for name, zone in (("a", "east"), ("b", "west")):
            member = ToyMember(etcd_server.endpoint, etcd_prefix, name, zone)
            started.append(member)
            await member.start()
        yield started
    finally:
        for member in started:
            if member.membership.lease is not None and member.local is not None:
                await member.stop()


def serving(members: list[ToyMember], item: str) -> list[str]:
    return [m.id.suffix for m in members if m.local and item in m.local.items]


async def put(member: ToyMember, counter: Counter) -> None:
    await member.etcd.put(member.layout.item_key(counter.name),
                          json.dumps(counter.__dict__).encode())


NAMES = [f"counters/c{i}" for i in range(6)]


async def test_items_are_assigned_opened_forwarded_and_drained(
        members: list[ToyMember]) -> None:
    a, b = members
    for name in NAMES:
        await put(a, Counter(name))
    # Assignment: each counter is opened on exactly one member, the one assigned.
    await eventually(lambda: all(len(serving(members, n)) == 1 for n in NAMES),
                     "every counter is served on one member")
    assert {s for n in NAMES for s in serving(members, n)} == {"a", "b"}, \
        "the allocator spreads the counters over both members"
    for name in NAMES:
        holder = next(m for m in members if m.local and name in m.local.items)
        assigned = assignments_of(a.keyspace, a.layout, name)
        assert [x.member for x in assigned] == [holder.id]
    # The primary announced its route: the assignment holds it (what drains wait for).
    await eventually(lambda: all(a.resolver is not None and
                                 a.resolver.resolve(n, announced=True).announced
                                 for n in NAMES), "every route is announced")

    # Forwarding: any member answers for any counter, from the member serving it.
    for name in NAMES:
        for member in members:
            answer = await ask(member, name)
            assert answer["served_by"] == serving(members, name)[0]
    # do_not_proxy: a member not serving it refuses, naming the primary's endpoint.
    name = next(n for n in NAMES if serving(members, n) == ["a"])
    answer = await ask(b, name, do_not_proxy=True)
    assert answer == {"refused": "not the primary here", "primary": a.endpoint}

    # Drain: member a asks for nothing; every counter moves to b, a's close.
    on_a = [n for n in NAMES if serving(members, n) == ["a"]]
    assert on_a
    assert a.resolver is not None
    assert await a.membership.drain(a.resolver.assigned, timeout=20)
    assert all(serving(members, n) == ["b"] for n in NAMES)
    await eventually(lambda: all(c.closed == CLOSED_MOVED for c in a.closed),
                     "a's counters are closed as moved away")
    assert {c.spec.name for c in a.closed} >= set(on_a)
    for name in on_a:  # and a still forwards to b until it leaves
        assert (await ask(a, name))["served_by"] == "b"


async def test_an_item_that_cannot_open_is_unready_and_retried(
        members: list[ToyMember]) -> None:
    a, _ = members
    await put(a, Counter("counters/broken", broken=True))

    def unready() -> list[str]:
        return [m.local.unready.get("counters/broken", "") for m in members if m.local]

    await eventually(lambda: any(unready()), "the broken counter is named unready")
    assert "its store is down" in " ".join(unready())
    assert serving(members, "counters/broken") == []
    # Mended (a new spec), it is opened.
    await put(a, Counter("counters/broken"))
    await eventually(lambda: len(serving(members, "counters/broken")) == 1,
                     "the mended counter is served")
    assert not any(unready())
    # Deleted, it closes everywhere.
    await a.etcd.delete_prefix(a.layout.item_key("counters/broken"))
    await eventually(lambda: serving(members, "counters/broken") == [],
                     "the deleted counter is closed")


async def test_a_channel_to_a_member_that_restarts_connects_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34, item 13: a channel to a member that was down sits in a reconnect
    backoff grown while it was down (seconds); when the member is back, the next call
    through `Channels` must not fail for the rest of that backoff (a primary's
    replication to a restarted peer did, for 1.5 s)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1._async import HealthServicer

    from gazette.cluster import forward
    from gazette.local.process import free_port

    monkeypatch.setattr(forward, "RENEW_SECONDS", 0.0, raising=False)
    endpoint = f"http://127.0.0.1:{free_port()}"

    async def serve() -> grpc.aio.Server:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
        assert server.add_insecure_port(endpoint.removeprefix("http://"))
        await server.start()
        return server

    used: list[grpc.aio.Channel] = []

    async def check() -> bool:
        used.append(channels.get(endpoint))
        try:
            await health_pb2_grpc.HealthStub(used[-1]).Check(
                health_pb2.HealthCheckRequest(), timeout=5)
            return True
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            return False

    channels = Channels()
    server = await serve()
    try:
        assert await check()
        await server.stop(None)
        # Down for a while: failing calls grow the channel's reconnect backoff.
        loop = asyncio.get_running_loop()
        down_since = loop.time()
        while loop.time() - down_since < 4:  # the outage's length, calls failing
            assert not await check()
            await asyncio.sleep(0.2)
        await eventually(lambda: used[-1].get_state() is
                         grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                         "the channel is in its reconnect backoff", 5)
        server = await serve()
        assert await check(), "the first call to the restarted member failed"
    finally:
        await server.stop(None)
        await channels.close()
