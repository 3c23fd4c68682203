"""The broker process's parts, wired together: etcd, the keyspace, this broker's
membership (`gazette.cluster.Membership`: its member spec under a lease, the allocator,
the drain), the journal replicas, the gRPC server (Journal + health), the data path (framed
appends, with ``--broker.data-port``) and the HTTP gateway (journals, ``/metrics``,
``/healthz``).

`BrokerServer` is what ``gazette serve`` runs and what tests and the local cluster embed:
``await server.start()``, then ``await server.wait()`` (returns when the lease is lost),
then ``await server.stop()``, which first drains the broker (its member spec asks for no
journals, and it waits until the allocator has moved them all to other brokers), then
drains RPCs, rolls and persists every spool, and removes the member spec.

Every broker runs the allocator (`gazette.allocator.Allocator`); the oldest one leads.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1._async import HealthServicer

from gazette.allocator import assignments_of, route_of
from gazette.auth import Capability, MemberSecurity, SecurityConfig
from gazette.cluster import (
    DEFAULT_ETCD_STARTUP_TIMEOUT,
    DEFAULT_LEASE_TTL,
    Channels,
    Membership,
)
from gazette.fragment import DEFAULT_MAX_PENDING_BYTES
from gazette.keyspace import Decoder, Etcd, KeySpace, Layout, Lease, apply_changes
from gazette.protocol import JournalSpec, MemberSpec, ProcessId, journal_changes_from_yaml
from gazette.serving.member import MemberProcess, default_member_suffix
from gazette_broker.broker import DEFAULT_CACHE_BYTES, Broker
from gazette_broker.framed import FramedServer
from gazette_broker.http import HttpGateway
from gazette_broker.replica import DEFAULT_APPEND_IDLE_TIMEOUT, DEFAULT_MAX_APPEND_SIZE
from gazette_broker.routing import JournalRouting
from gazette_broker.service import JOURNAL_CAPABILITIES, JournalService, add_journal_service
from gazette_broker.service_appends import AppendRpcs

log = logging.getLogger(__name__)


def default_suffix() -> str:
    return default_member_suffix("broker")


@dataclass
class BrokerConfig(SecurityConfig):
    """What ``gazette serve`` is configured with: what each field means is said once, by
    its option (`gazette_broker.cli.SERVE_OPTIONS`, and the security fields'
    `gazette.serving.options.SECURITY_OPTIONS`), which defaults to the field's default;
    tests and the local cluster build one directly."""

    zone: str = "local"
    suffix: str = field(default_factory=default_suffix)
    host: str = "localhost"
    bind: str = ""
    port: int = 8080
    http_port: int = 8081
    data_port: int = -1
    file_root: Path | None = None
    spool_dir: Path | None = None
    etcd_address: str = "http://localhost:2379"
    etcd_prefix: str = "/gazette/cluster"
    lease_ttl: int = DEFAULT_LEASE_TTL
    journal_limit: int = 1024
    max_append_size: int = DEFAULT_MAX_APPEND_SIZE
    grace: float = 5.0
    #: Seconds spools get to persist on shutdown (no option).
    persist_timeout: float = 60.0
    drain_timeout: float = 60.0
    etcd_startup_timeout: float = DEFAULT_ETCD_STARTUP_TIMEOUT
    append_idle_timeout: float = DEFAULT_APPEND_IDLE_TIMEOUT
    cache_bytes: int = DEFAULT_CACHE_BYTES
    max_unpersisted_bytes: int = DEFAULT_MAX_PENDING_BYTES


class BrokerServer:
    """One broker: start, serve until told to stop (or the lease is lost), stop."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.layout = Layout(config.etcd_prefix)
        self.id = ProcessId(config.zone, config.suffix)
        self.security = MemberSecurity(config, f"broker {self.id}",
                                       frozenset({Capability.REPLICATE}),
                                       JOURNAL_CAPABILITIES)
        self.etcd = Etcd(config.etcd_address, tls=self.security.etcd_tls)
        self.keyspace: KeySpace[Any] = KeySpace(self.etcd, self.layout.root + "/",
                                                Decoder(self.layout))
        self._own_spool_dir = config.spool_dir is None
        self.spool_dir = config.spool_dir or Path(tempfile.mkdtemp(prefix="gazette-spools-"))
        self.member: MemberSpec | None = None
        self.membership = Membership(
            self.etcd, self.keyspace, self.layout, self.id, lease_ttl=config.lease_ttl,
            stores_of=lambda spec: spec.fragment.stores,
            startup_timeout=config.etcd_startup_timeout)
        self.broker = Broker(self.keyspace, self.layout, self.spool_dir,
                             file_root=config.file_root,
                             max_append_size=config.max_append_size,
                             me=self.id, etcd=self.etcd, live=self.membership.live,
                             cache_bytes=config.cache_bytes,
                             max_pending_bytes=config.max_unpersisted_bytes,
                             append_idle_timeout=config.append_idle_timeout,
                             channels=Channels(self.security.tls, self.security.token))
        self.process = MemberProcess(
            "broker", self.etcd, self.membership, self.security, self.broker.supervisor,
            grace=config.grace, drain_timeout=config.drain_timeout,
            services=["gazette.broker.Journal"])
        self.http: HttpGateway | None = None
        self.http_port = 0
        self.framed: FramedServer | None = None
    @property
    def health(self) -> HealthServicer:
        return self.process.health

    @property
    def grpc_server(self) -> grpc.aio.Server | None:
        return self.process.grpc_server

    @property
    def grpc_port(self) -> int:
        return self.process.port

    @property
    def grpc_address(self) -> str:
        return f"{self.config.host}:{self.grpc_port}"

    @property
    def endpoint(self) -> str:
        return f"{self.security.scheme}://{self.config.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.security.scheme}://{self.config.host}:{self.http_port}" \
            if self.http_port else ""

    @property
    def file_root(self) -> Path | None:
        return self.config.file_root

    async def start(self) -> None:
        """Bind the ports, connect to etcd, announce the member spec, open replicas and
        start serving. On failure, whatever was started is stopped again."""
        cfg = self.config
        await self.process.start(cfg.bind, cfg.port, serve=self._serve,
                                 run=self.broker.start, stop=self.stop)
        assert self.member is not None
        log.info("broker %s serving: gRPC %s, HTTP %s, etcd %s%s", self.member.id,
                 self.endpoint, self.http_url or "off", cfg.etcd_address, self.layout.root)

    async def _serve(self, grpc_server: grpc.aio.Server) -> MemberSpec:
        """The Journal service, the data path and the HTTP gateway; this broker's member
        spec."""
        cfg = self.config
        data_endpoint = ""
        if cfg.data_port >= 0:
            tls = self.security.http_context()
            self.framed = FramedServer(self.security.authorizer, ssl_context=tls)
            port = await self.framed.start(cfg.bind or None, cfg.data_port)
            data_endpoint = f"{'tls' if tls is not None else 'tcp'}://{cfg.host}:{port}"
        self.member = MemberSpec(self.id, self.endpoint, cfg.journal_limit,
                                 store_schemes=self.store_schemes,
                                 data_endpoint=data_endpoint)
        self.routing = JournalRouting(
            self.broker.replicas, self.etcd, self.keyspace, self.layout, member=self.member,
            unready=self.broker.unready, resolver=self.broker.resolver,
            channels=self.broker.channels, wait_serving=self.broker.wait_serving)
        add_journal_service(JournalService(self.routing), grpc_server)
        if self.framed is not None:
            self.framed.rpcs = AppendRpcs(self.routing)
        if cfg.http_port >= 0:
            self.http = HttpGateway(self.routing, ready=self.membership.ready,
                                    grace=cfg.grace, content_type=self._content_type,
                                    max_append_size=cfg.max_append_size,
                                    authorizer=self.security.authorizer,
                                    spec_of=self._spec_of)
            self.http_port = await self.http.start(cfg.bind or None, cfg.http_port,
                                                   ssl=self.security.http_context())
        return self.member

    @property
    def store_schemes(self) -> tuple[str, ...]:
        """The kinds of fragment store this broker can serve journals of."""
        return ("file", "s3") if self.config.file_root is not None else ("s3",)

    def _spec_of(self, journal: str) -> JournalSpec | None:
        entry = self.keyspace.get(self.layout.item_key(journal))
        return entry.value if entry is not None and isinstance(entry.value, JournalSpec) \
            else None

    def _content_type(self, journal: str) -> str:
        spec = self._spec_of(journal)
        return (spec.labels.values("content-type") or ("",))[0] if spec is not None else ""

    @property
    def lease(self) -> Lease | None:
        return self.membership.lease

    async def drain(self, timeout: float) -> bool:
        """Ask for no journals and wait until none that may hold data is assigned here
        any more (see `Membership.drain`; a journal never opened here holds nothing).
        Returns whether that happened in `timeout`."""
        resolver = self.broker.resolver
        assert resolver is not None
        return await self.membership.drain(
            lambda: self.broker.local.holding(resolver.assigned()), timeout)

    async def wait(self) -> None:
        """Return only when the broker can no longer serve: its lease is lost (it must
        not keep acting as a member: raises `LeaseLost`), or a task it cannot do without
        failed for good (raises `TaskFailed`)."""
        await self.process.wait()

    async def stop(self) -> None:
        """Stop serving: the broker drains, health goes NOT_SERVING, new RPCs are refused
        and in-flight ones get `grace` seconds; spools roll and persist (bounded); the
        member spec is removed; every task is stopped. Safe to call more than once."""
        if not await self.process.stop(drain=self.drain, close=self._close,
                                       stop_http=self._stop_edges):
            return
        if self._own_spool_dir and not self.broker.persister_backlog():
            shutil.rmtree(self.spool_dir, ignore_errors=True)
        log.info("broker stopped")

    async def _stop_edges(self) -> None:
        """The data path and the HTTP gateway, given `grace` for what is in flight."""
        if self.framed is not None:
            await self.framed.stop(self.config.grace)
        if self.http is not None:
            await self.http.stop()

    async def _close(self) -> None:
        """The broker: its spools rolled and persisted."""
        await self.broker.close(drain_timeout=self.config.persist_timeout)

    # -- conveniences for tests and the local cluster --

    async def apply_yaml(self, text: str, timeout: float = 10.0) -> int:
        """Apply a journal spec tree (``gazctl journals apply`` YAML, each spec at its
        current revision) and wait until this broker serves every journal in it."""
        changes = journal_changes_from_yaml(text)
        revision = await apply_changes(self.etcd, self.layout, changes)
        await self.keyspace.wait_for_revision(revision, timeout=timeout)
        await self.wait_routed({c.name for c in changes if isinstance(c.spec, JournalSpec)},
                               timeout)
        return revision

    def routed(self, journal: str) -> bool:
        """Whether `journal` has a primary and every replica has its route."""
        assigned = assignments_of(self.keyspace, self.layout, journal)
        route = route_of(assigned)
        return route.primary >= 0 and all(a.value == route.encode() for a in assigned)

    async def wait_routed(self, journals: set[str], timeout: float = 10.0) -> None:
        """Wait until every one of `journals` is routed (`routed`), and those assigned
        here are served here."""
        changed = asyncio.Event()
        stop = self.keyspace.observe(lambda revision, events: changed.set())
        try:
            async with asyncio.timeout(timeout):
                while not all(self.routed(j) for j in journals):
                    await changed.wait()
                    changed.clear()
                assert self.broker.resolver is not None
                await self.broker.wait_serving(journals & self.broker.resolver.assigned())
        finally:
            stop()
