"""Shared pieces of the stream-sum fault tests: ``gazette-consumer serve`` members that
keep their names and ports across restarts, a cluster of etcd and three brokers with
the stream-sum journals and shards, the driver's load, and waits on members' leases
and shards' primaries. Mutual TLS and authorization are on everywhere
(`ClusterSecurity`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gazette.allocator import assignments_of, route_of
from gazette.client import JournalClient
from gazette.errors import GazetteError
from gazette.keyspace import Decoder, Etcd, KeySpace, Layout
from gazette.local.etcd import EmbeddedEtcd, EtcdCluster
from gazette.local.process import Process, free_port, log_tail
from gazette_consumer.examples.stream_sum import APP, SUMS, Driver, setup, shard_id
from tests.fault.cluster import Broker
from tests.fixtures.polling import eventually
from tests.fixtures.security import ClusterSecurity

BROKERS = "/gazette/cluster"
CONSUMERS = "/gazette/consumers"
LEASE_TTL = 4
SHARDS = [shard_id(i) for i in range(4)]
APP_MODULE = "gazette_consumer.examples.stream_sum:StreamSum"


@dataclass
class Member:
    """A ``gazette-consumer serve`` process of stream-sum that keeps its name and ports
    across restarts."""

    zone: str
    name: str
    workdir: Path
    etcd: str
    brokers: str
    env: dict[str, str]
    security: ClusterSecurity
    port: int = field(default_factory=free_port)
    #: Its HTTP port (``/metrics``, ``/healthz``, the application's routes).
    http_port: int = field(default_factory=free_port)
    #: The application served on stream-sum's shards (another module names its app
    #: with ``CONSUMER_APP`` in `env`).
    app: str = APP_MODULE
    process: Process = field(init=False)

    def __post_init__(self) -> None:
        argv = [sys.executable, "-m", "gazette_consumer", "serve", "--app", self.app,
                "--consumer.zone", self.zone, "--consumer.id", self.name,
                "--consumer.host", "127.0.0.1", "--consumer.bind", "127.0.0.1",
                "--consumer.port", str(self.port), "--consumer.http-port", str(self.http_port),
                "--consumer.lease-ttl", str(LEASE_TTL), "--consumer.drain-timeout", "20",
                "--broker.address", self.brokers, "--etcd.address", self.etcd,
                "--etcd.prefix", CONSUMERS, *self.security.flags()]
        self.process = Process(self.name, argv, self.workdir / f"{self.name}.log",
                               env=self.env)


@dataclass
class Cluster:
    """etcd, three brokers (two zones) and the stream-sum journals and shards; members
    are added by the test."""

    workdir: Path
    etcd: EmbeddedEtcd | EtcdCluster
    brokers: list[Broker]
    security: ClusterSecurity
    members: list[Member] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    consumers: Layout = field(default_factory=lambda: Layout.consumer_app(APP, CONSUMERS))
    cluster: Layout = field(default_factory=lambda: Layout(BROKERS))
    keyspace: KeySpace[Any] | None = None  # the consumer application's
    broker_keyspace: KeySpace[Any] | None = None

    @property
    def target(self) -> str:
        return "ipv4:" + ",".join(b.address for b in self.brokers)

    def member(self, name: str, env: dict[str, str], zone: str = "zone-a",
               app: str = APP_MODULE) -> Member:
        member = Member(zone, name, self.workdir, self.etcd.endpoint, self.target, env,
                        self.security, app=app)
        self.members.append(member)
        member.process.start()
        return member

    def primaries(self) -> dict[str, str]:
        """Shard -> the member name its route names primary."""
        assert self.keyspace is not None
        out = {}
        for shard in SHARDS:
            route = route_of(assignments_of(self.keyspace, self.consumers, shard))
            if route.primary >= 0:
                out[shard] = route.members[route.primary].suffix
        return out

    def lease_of(self, member: Member) -> int:
        """The lease of `member`'s process (0: none has joined)."""
        assert self.keyspace is not None
        entry = self.keyspace.get(self.consumers.member_key(member.zone, member.name))
        return entry.kv.lease if entry is not None else 0

    def leases(self) -> dict[str, int]:
        """Each broker's and member's lease (0: it has none), by name."""
        assert self.broker_keyspace is not None
        out = {m.name: self.lease_of(m) for m in self.members}
        for b in self.brokers:
            entry = self.broker_keyspace.get(self.cluster.member_key(b.zone, b.name))
            out[b.name] = entry.kv.lease if entry is not None else 0
        return out

    def exited(self) -> list[str]:
        """The brokers and members whose processes are not running."""
        return [p.name for p in [*(m.process for m in self.members),
                                 *(b.process for b in self.brokers)] if not p.running()]

    def runs_all(self, member: Member) -> bool:
        """Whether the process of `member` that holds its lease is every shard's primary."""
        assert self.keyspace is not None
        lease = self.lease_of(member)
        entries = [self.keyspace.get(self.consumers.assignment_key(
            s, member.zone, member.name, 0)) for s in SHARDS]
        return lease != 0 and all(e is not None and e.kv.lease == lease for e in entries)

    def broker_primary(self, journal: str) -> Broker | None:
        """The broker `journal`'s route names primary (None: none, a moment after its
        primary's lease expired)."""
        assert self.broker_keyspace is not None
        route = route_of(assignments_of(self.broker_keyspace, self.cluster, journal))
        return next((b for b in self.brokers if b.id == route.primary_id), None)

    def journal_ok(self, journal: str, replicas: int = 3) -> bool:
        """Whether `journal` has its `replicas`, a primary, and the route acknowledged."""
        assert self.broker_keyspace is not None
        assigned = assignments_of(self.broker_keyspace, self.cluster, journal)
        route = route_of(assigned)
        return len(assigned) == replicas and route.primary >= 0 and all(
            a.value == route.encode() for a in assigned)

    def diagnosis(self) -> str:
        """What went wrong, from the processes' logs."""
        lines = [f"faults: {self.faults}"]
        for member in self.members:
            text = member.process.log_path.read_text(errors="replace").splitlines()
            lines += [f"{member.name}: {x}" for x in text if "ERROR" in x or "failed" in x]
            lines.append(f"{member.name} (tail):\n{log_tail(member.process.log_path, 8)}")
        for broker in self.brokers:  # what brokers say of their journals' offsets
            text = broker.log_path.read_text(errors="replace").splitlines()
            lines += [f"{broker.name}: {x}" for x in text if "ERROR" in x or any(
                word in x for word in ("peers only", "all roll to", "no fragment known",
                                       "a peer's copy"))]
        return "\n".join(lines[-120:])


@contextlib.asynccontextmanager
async def running_cluster(workdir: Path, etcd_nodes: int = 1, broker_http: bool = False,
                          data_path: bool | None = None, **setup_kw: Any
                          ) -> AsyncIterator[Cluster]:
    """The cluster (on an etcd of `etcd_nodes` members), its journals and shards made
    (`setup_kw`: more of `setup`'s options); members are started by the test, and
    everything is killed at the end. `broker_http`: brokers serve HTTP (and so
    ``/metrics``) on ports of their own; `data_path`: brokers serve the data path (None:
    as ``GAZETTE_TEST_DATA_PATH`` says)."""
    security = ClusterSecurity.make(workdir / "pki")
    etcd = EmbeddedEtcd(workdir / "etcd", tls=security.etcd_tls) if etcd_nodes == 1 \
        else EtcdCluster(workdir / "etcd", etcd_nodes, tls=security.etcd_tls)
    await asyncio.to_thread(etcd.start)
    brokers = [Broker(zone, f"broker-{i}", free_port(), workdir, etcd.endpoint, BROKERS,
                      LEASE_TTL, security, http_port=free_port() if broker_http else -1,
                      **({} if data_path is None else {"data_port": 0 if data_path else -1}))
               for i, zone in enumerate(["zone-a", "zone-a", "zone-b"])]
    cluster = Cluster(workdir, etcd, brokers, security)
    try:
        for b in brokers:
            b.start()
        async with Etcd(etcd.endpoint, tls=security.etcd_tls) as client, \
                KeySpace(client, cluster.cluster.root + "/",
                         Decoder(cluster.cluster)) as brokers_ks, \
                KeySpace(client, cluster.consumers.root + "/",
                         Decoder(cluster.consumers, consumers=True)) as consumers_ks:
            cluster.keyspace, cluster.broker_keyspace = consumers_ks, brokers_ks
            await eventually(lambda: len(brokers_ks.prefixed(cluster.cluster.members)) == 3,
                             "three brokers joined", 30)
            async with JournalClient(cluster.target, auth=security.client()) as journals:
                await setup(journals, client, replication=3, etcd_root=CONSUMERS, **setup_kw)
            await eventually(lambda: cluster.journal_ok(SUMS), "the journals are assigned",
                             30)
            try:
                yield cluster
            except BaseException:
                await dump_tasks([c.process for c in [*cluster.members, *brokers]])
                raise
    finally:
        for m in cluster.members:
            await asyncio.to_thread(m.process.stop, 20.0, signal.SIGKILL)
        for b in brokers:
            await asyncio.to_thread(b.process.stop, 20.0, signal.SIGKILL)
        await asyncio.to_thread(etcd.stop)


async def dump_tasks(processes: list[Process]) -> None:
    """Have each running process log its asyncio tasks (SIGUSR1), so that the logs of
    a failed run say where each one waited; give them a moment to write."""
    running = [p for p in processes if p.running()]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGUSR1)

    def logged() -> bool:
        return all("SIGUSR1:" in p.log_path.read_text(errors="replace") for p in running)

    with contextlib.suppress(AssertionError):
        await eventually(logged, "the processes logged their tasks", 5)


class Load:
    """The driver, publishing waves of streams from ``async with`` until `finish`;
    `progress` waits for more exact sums."""

    def __init__(self, driver: Driver, cluster: Cluster) -> None:
        self.driver, self.cluster = driver, cluster
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def _publish(self) -> None:
        while not self.stop.is_set():
            await self.driver.publish(6, 12, pace=0.01)

    async def __aenter__(self) -> Load:
        self.task = asyncio.create_task(self._publish())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the test failed: stop publishing
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def finish(self) -> None:
        """Finish the wave under way, and publish no more."""
        self.stop.set()
        assert self.task is not None
        await self.task

    async def exact(self) -> int:
        try:
            return (await self.driver.check()).exact
        except GazetteError:
            return -1  # the output is unreadable a moment (a broker is down)

    async def progress(self, more: int = 6, timeout: float = 30) -> None:
        assert self.task is not None
        goal = more

        async def reached() -> bool:
            if self.task is not None and self.task.done():
                self.task.result()  # the driver failed: say why
            return await self.exact() >= goal

        try:
            # Bounded as a whole: a read of the output may itself wait while brokers
            # are down, and a hang would only show as the test's timeout.
            async with asyncio.timeout(3 * timeout):
                goal = max(await self.exact(), 0) + more
                await eventually(reached, f"{more} more exact sums", timeout, interval=0.25)
        except (AssertionError, TimeoutError) as err:
            raise AssertionError(f"{more} more exact sums: {err or 'timed out'}\n"
                                 f"{self.cluster.diagnosis()}\n{self.where()}") from None

    def where(self) -> str:
        """Where the driver's tasks wait (for a failed run): each of this loop's tasks
        that runs gazette code, innermost frame last."""
        queue = self.driver.appender.queue
        lines = [f"appends in flight: {queue._inflight}, pending bytes: {queue.pending_bytes}"]
        for task in asyncio.all_tasks():
            where, gazette = [], False
            coro: Any = task.get_coro()
            while coro is not None and len(where) < 30:  # (the chain of awaits, inward)
                frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
                if frame is None:
                    where.append(type(coro).__name__)
                    break
                code = frame.f_code
                gazette = gazette or "gazette" in code.co_filename
                where.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}:"
                             f"{frame.f_lineno}")
                coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
            if gazette:
                lines.append(f"task {task.get_name()}: " + " > ".join(where))
        return "\n".join(lines)


def member_gone(cluster: Cluster, member: Member) -> bool:
    return cluster.lease_of(member) == 0


def busiest(cluster: Cluster, members: list[Member]) -> Member:
    counts = list(cluster.primaries().values())
    return max(members, key=lambda m: counts.count(m.name))


async def restart(cluster: Cluster, member: Member, lease: int) -> None:
    """Start `member` again; wait until it joined (under a lease other than `lease`)."""
    member.process.start()
    await eventually(lambda: cluster.lease_of(member) not in (0, lease),
                     f"{member.name} joined again", 30)


async def others_run_all(cluster: Cluster, member: Member) -> None:
    """Wait until `member`'s lease expired and the others run every shard."""
    await eventually(lambda: member_gone(cluster, member), f"{member.name}'s lease "
                     "expired", 4 * LEASE_TTL)
    await eventually(lambda: len(cluster.primaries()) == 4 and member.name not in
                     cluster.primaries().values(), "the others run every shard", 30)


async def sigkill_busiest(cluster: Cluster, members: list[Member],
                          progress: Callable[[], Awaitable[None]]) -> Member:
    """SIGKILL the member of `members` that runs the most shards: the others take them
    over and `progress`; it starts again (a new lease) and they `progress` again.
    Returns it."""
    victim = busiest(cluster, members)
    lease = cluster.lease_of(victim)
    await asyncio.to_thread(victim.process.kill)
    cluster.faults.append(f"SIGKILL {victim.name}")
    await others_run_all(cluster, victim)
    await progress()
    await restart(cluster, victim, lease)
    await progress()
    return victim
