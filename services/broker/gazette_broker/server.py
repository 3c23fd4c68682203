"""The broker process's parts, wired together: etcd, the keyspace, this broker's
membership (`gazette.cluster.Membership`: its member spec under a lease, the allocator,
the drain), the journal replicas, the gRPC server (Journal + health) and the HTTP
gateway (journals, ``/metrics``, ``/healthz``).

`BrokerServer` is what ``gazette serve`` runs and what tests and the local cluster embed:
``await server.start()``, then ``await server.wait()`` (returns when the lease is lost),
then ``await server.stop()``, which first drains the broker (its member spec asks for no
journals, and it waits until the allocator has moved them all to other brokers), then
drains RPCs, rolls and persists every spool, and removes the member spec.

Every broker runs the allocator (`gazette.allocator.Allocator`); the oldest one leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from gazette.allocator import assignments_of, route_of
from gazette.auth import Capability, MemberSecurity, SecurityConfig
from gazette.cluster import (
    DEFAULT_ETCD_STARTUP_TIMEOUT,
    DEFAULT_LEASE_TTL,
    Channels,
    Membership,
)
from gazette.cluster.malformed import add_guarded
from gazette.fragment import DEFAULT_MAX_PENDING_BYTES
from gazette.keyspace import Decoder, Etcd, KeySpace, Layout, Lease, apply_changes
from gazette.protocol import JournalSpec, MemberSpec, ProcessId, journal_changes_from_yaml
from gazette.shell import default_member_suffix, grpc_server_on
from gazette_broker.broker import DEFAULT_CACHE_BYTES, Broker
from gazette_broker.http import HttpGateway
from gazette_broker.replica import DEFAULT_APPEND_IDLE_TIMEOUT, DEFAULT_MAX_APPEND_SIZE
from gazette_broker.routing import JournalRouting
from gazette_broker.service import JOURNAL_CAPABILITIES, JournalService, add_journal_service

log = logging.getLogger(__name__)




def default_suffix() -> str:
    return default_member_suffix("broker")



@dataclass
class BrokerConfig(SecurityConfig):
    """What ``gazette serve`` is configured with: each field has a flag and an
    environment variable (`gazette_broker.cli.SERVE_FLAGS`, and the security fields'
    `gazette.shell.SECURITY_FLAGS`); tests and the local cluster build one directly."""

    zone: str = "local"
    suffix: str = field(default_factory=default_suffix)
    #: Host name others reach this broker at (advertised in its member spec).
    host: str = "localhost"
    #: Interface to listen on ("" = all).
    bind: str = ""
    #: gRPC port (0: a free one).
    port: int = 8080
    #: HTTP gateway port (0: a free one; -1: no gateway).
    http_port: int = 8081
    #: Root folder of ``file:///`` stores (None: file stores are refused).
    file_root: Path | None = None
    #: Folder for spools (None: a temporary one, removed on a clean exit).
    spool_dir: Path | None = None
    etcd_address: str = "http://localhost:2379"
    etcd_prefix: str = "/gazette/cluster"
    #: Seconds the member spec outlives this broker if it dies without cleaning up: a
    #: dead primary's journals fail over after about this long.
    lease_ttl: int = DEFAULT_LEASE_TTL
    journal_limit: int = 1024
    max_append_size: int = DEFAULT_MAX_APPEND_SIZE
    #: Seconds in-flight RPCs get to finish on shutdown before they are cancelled.
    grace: float = 5.0
    #: Seconds spools get to persist on shutdown.
    persist_timeout: float = 60.0
    #: Seconds a stopping broker waits for its journals to move to other brokers.
    drain_timeout: float = 60.0
    #: Seconds a starting broker waits for etcd to answer (it retries meanwhile).
    etcd_startup_timeout: float = DEFAULT_ETCD_STARTUP_TIMEOUT
    #: Seconds an append stream may bring no content before it is aborted.
    append_idle_timeout: float = DEFAULT_APPEND_IDLE_TIMEOUT
    #: Bytes of persisted fragments cached on local disk for readers.
    cache_bytes: int = DEFAULT_CACHE_BYTES
    #: Bytes of closed spools that may wait for one store before appends to it wait.
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
        self.health = HealthServicer()
        self.grpc_server: grpc.aio.Server | None = None
        self.http: HttpGateway | None = None
        self.grpc_port = 0
        self.http_port = 0
        self._started = False

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
        """Connect to etcd, bind the ports, announce the member spec, open replicas and
        start serving. On failure, whatever was started is stopped again."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        cfg = self.config
        self._started = True
        # The ports first: a port in use fails at once, before any wait for etcd.
        self.grpc_server, self.grpc_port = grpc_server_on(
            cfg.bind, cfg.port, "broker", self.security.server_credentials(),
            self.security.interceptors())
        self.member = MemberSpec(self.id, self.endpoint, cfg.journal_limit,
                                 store_schemes=self.store_schemes)
        self.routing = JournalRouting(
            self.broker.replicas, self.etcd, self.keyspace, self.layout, member=self.member,
            unready=self.broker.unready, resolver=self.broker.resolver,
            channels=self.broker.channels, wait_serving=self.broker.wait_serving)
        add_journal_service(JournalService(self.routing), self.grpc_server)
        # Malformed health checks too: INVALID_ARGUMENT naming the field.
        add_guarded(health_pb2_grpc.add_HealthServicer_to_server, self.health,
                    self.grpc_server)
        if cfg.http_port >= 0:
            self.http = HttpGateway(self.routing, ready=self.membership.ready,
                                    grace=cfg.grace, content_type=self._content_type,
                                    max_append_size=cfg.max_append_size,
                                    authorizer=self.security.authorizer,
                                    spec_of=self._spec_of)
            self.http_port = await self.http.start(cfg.bind or None, cfg.http_port,
                                                   ssl=self.security.http_context())

        await self.etcd.connect()
        deadline = self.membership.deadline()
        await self.membership.load(deadline)
        # This broker sees itself before it serves (Apply's warnings count it, say).
        await self.membership.join(self.member, self.broker.supervisor, deadline)
        await self.broker.start()
        self.membership.run_allocator(self.broker.supervisor)
        await self.grpc_server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set("gazette.broker.Journal", health_pb2.HealthCheckResponse.SERVING)
        log.info("broker %s serving: gRPC %s, HTTP %s, etcd %s%s", self.member.id,
                 self.endpoint, self.http_url or "off", cfg.etcd_address, self.layout.root)

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
        await self.membership.wait(self.broker.supervisor)

    async def stop(self) -> None:
        """Stop serving: health goes NOT_SERVING, new RPCs are refused and in-flight ones
        get `grace` seconds; spools roll and persist (bounded); the member spec is
        removed; every task is stopped. Safe to call more than once."""
        if not self._started:
            return
        self._started = False
        cfg = self.config
        if self.grpc_server is not None and self.lease is not None:
            try:
                await self.drain(cfg.drain_timeout)
            except Exception as err:  # noqa: BLE001 - stopping goes on regardless
                log.warning("draining failed: %s", err)
        with contextlib.suppress(Exception):
            await self.health.enter_graceful_shutdown()
        stopping = []
        if self.grpc_server is not None:
            stopping.append(self.grpc_server.stop(grace=cfg.grace))
        if self.http is not None:
            stopping.append(self.http.stop())
        await asyncio.gather(*stopping, return_exceptions=True)
        await self.broker.close(drain_timeout=cfg.persist_timeout)
        await self.membership.leave()  # the member spec goes with its lease
        if self._own_spool_dir and not self.broker.persister_backlog():
            shutil.rmtree(self.spool_dir, ignore_errors=True)
        log.info("broker stopped")

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
