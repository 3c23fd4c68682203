"""A consumer member: one process of a consumer application, serving its shards.

It joins the application's group under ``{etcd root}/{app name}`` (`gazette.cluster.
Membership`: its member spec under a lease, the allocator), and turns the shards assigned
to it into `LocalShard`s (`gazette.cluster.LocalItems`), each running the application as
primary through a `ShardRunner`, reading from and publishing to the brokers at
`broker_address`. Stopping drains first: the member asks for no shards and waits until
the allocator has moved them all, then stops its shards and leaves.

``await member.start()``, ``await member.wait()`` (returns only when the lease is lost or
a task failed for good), ``await member.stop()``.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1._async import HealthServicer

from gazette.auth import Capability, MemberSecurity, SecurityConfig
from gazette.client import AppendQueue, JournalClient
from gazette.cluster import (
    DEFAULT_ETCD_STARTUP_TIMEOUT,
    DEFAULT_LEASE_TTL,
    Announcer,
    Channels,
    LocalItems,
    Membership,
    Resolver,
    StatusWriter,
    status_consistent,
)
from gazette.consumer.app import Application
from gazette.consumer.app_services import AppServices, authorize_route
from gazette.consumer.recovery import Recovery, Standby
from gazette.consumer.runner import ShardRunner
from gazette.consumer.service_shards import SHARD_CAPABILITIES, ShardService
from gazette.consumer.shard import LocalShard
from gazette.errors import ValidationError
from gazette.keyspace import (
    CONSUMER_ROOT,
    Decoder,
    Etcd,
    EtcdError,
    KeySpace,
    Layout,
    encode_consumer,
)
from gazette.pb import consumer_pb2_grpc
from gazette.protocol import MemberSpec, ProcessId, ReplicaStatus, ShardSpec
from gazette.serving.http_listener import HttpRunner, http_app
from gazette.serving.malformed_guard import add_guarded
from gazette.serving.member import MemberProcess, default_member_suffix
from gazette.supervise import Supervisor

log = logging.getLogger(__name__)

#: What a member's own token grants, toward brokers: read its shards' sources and
#: recovery logs, append their outputs, ACKs and logs.
MEMBER_CAPABILITIES = frozenset({Capability.LIST, Capability.READ, Capability.APPEND})

#: Seconds a stopping member waits for its shards' last appends (publishes, ACKs).
APPENDS_STOP_SECONDS = 10.0


def default_suffix() -> str:
    return default_member_suffix("consumer")


@dataclass
class MemberConfig(SecurityConfig):
    """What ``gazette-consumer serve`` is configured with; tests build one directly.
    Each field's flag, environment variable and help are described once, in
    `gazette_consumer.cli.SERVE_OPTIONS` (the security fields' in
    `gazette.serving.options`), which docs/consumers.md's table is made from."""

    app_name: str
    zone: str = "local"
    suffix: str = field(default_factory=default_suffix)
    host: str = "localhost"
    bind: str = ""
    port: int = 8090
    http_port: int = 8091
    shard_limit: int = 1024
    lease_ttl: int = DEFAULT_LEASE_TTL
    drain_timeout: float = 60.0
    grace: float = 5.0
    broker_address: str = "localhost:8080"
    etcd_address: str = "http://localhost:2379"
    etcd_root: str = CONSUMER_ROOT
    etcd_startup_timeout: float = DEFAULT_ETCD_STARTUP_TIMEOUT
    local_dir: str = ""

    def __post_init__(self) -> None:
        Layout.consumer_app(self.app_name, self.etcd_root)  # names a bad app or prefix
        if not 0 <= self.port <= 65535:
            raise ValidationError("consumer.port", f"must be in [0, 65535], got {self.port}")
        if not -1 <= self.http_port <= 65535:
            raise ValidationError("consumer.http-port",
                                  f"must be in [-1, 65535], got {self.http_port}")
        for name, value, low in (("consumer.limit", self.shard_limit, 0),
                                 ("consumer.lease-ttl", self.lease_ttl, 1)):
            if value < low:
                raise ValidationError(name, f"must be at least {low}, got {value}")


class ConsumerMember:
    """One member of `config.app_name`, running `app`."""

    def __init__(self, config: MemberConfig, app: Application) -> None:
        self.config, self.app = config, app
        self.layout = Layout.consumer_app(config.app_name, config.etcd_root)
        self.security = MemberSecurity(
            config, f"consumer {config.app_name} {config.zone}/{config.suffix}",
            MEMBER_CAPABILITIES, SHARD_CAPABILITIES, default=Capability.SHARD_CALL)
        self.etcd = Etcd(config.etcd_address, tls=self.security.etcd_tls)
        self.keyspace: KeySpace[Any] = KeySpace(self.etcd, self.layout.root + "/",
                                                Decoder(self.layout, consumers=True))
        self.id = ProcessId(config.zone, config.suffix)
        self.membership = Membership(
            self.etcd, self.keyspace, self.layout, self.id, lease_ttl=config.lease_ttl,
            encode=encode_consumer,
            replication_of=lambda spec: 0 if spec.disable else 1 + int(spec.hot_standbys),
            # A shard leaves a member only once its successor caught up (hand-off).
            is_consistent=status_consistent(self.keyspace, self.layout),
            startup_timeout=config.etcd_startup_timeout, kind="shard")
        self.supervisor = Supervisor(transient=(EtcdError, OSError))
        self.resolver: Resolver[ShardSpec] = Resolver(self.keyspace, self.layout, self.id,
                                                      ShardSpec)
        self.announcer = Announcer(self.etcd, self.keyspace, self.layout)
        self.statuses = StatusWriter(self.etcd, self.layout, self.id, self._lease_id)
        self.channels = Channels(self.security.tls, self.security.token)
        self.shards: LocalItems[ShardSpec, LocalShard] = LocalItems(
            self.keyspace, self.layout, ShardSpec, self._open, self.supervisor,
            resolver=self.resolver, kind="shard")
        #: Made in start(): gRPC channels belong to the loop they are made on.
        self.client: JournalClient | None = None
        self.appender: AppendQueue | None = None
        self.process = MemberProcess(
            "consumer member", self.etcd, self.membership, self.security, self.supervisor,
            grace=config.grace, drain_timeout=config.drain_timeout)
        self.http: HttpRunner | None = None
        self.http_port = 0
        self._temp_dir: tempfile.TemporaryDirectory[str] | None = None
        self.recovery: Recovery | None = None

    @property
    def health(self) -> HealthServicer:
        return self.process.health

    @property
    def grpc_server(self) -> grpc.aio.Server | None:
        return self.process.grpc_server

    @property
    def port(self) -> int:
        return self.process.port

    @property
    def endpoint(self) -> str:
        return f"{self.security.scheme}://{self.config.host}:{self.port}"

    @property
    def http_url(self) -> str:
        """Where this member serves HTTP ("" if it does not)."""
        return f"{self.security.scheme}://{self.config.host}:{self.http_port}" \
            if self.http_port else ""

    def _lease_id(self) -> int:
        lease = self.membership.lease
        assert lease is not None, "statuses are written only by a member that joined"
        return lease.id

    async def _open(self, spec: ShardSpec) -> LocalShard:
        return LocalShard(spec, self.id, self._runner, self.announcer.announce,
                          self.statuses.set, self._standby, live=self.membership.live)

    def _liveness_changed(self, live: bool) -> None:
        """Primaries stop while this member's lease may have run out, and run again."""
        for shard in self.shards.items.values():
            shard.update_live()

    def _runner(self, spec: ShardSpec) -> ShardRunner:
        assert self.client is not None and self.appender is not None, "start() first"
        return ShardRunner(spec, self.app, self.client, self.appender, self.recovery)

    def _standby(self, spec: ShardSpec) -> Standby:
        assert self.client is not None and self.recovery is not None, "start() first"
        return Standby(self.client, self.recovery, spec)

    def local_shard(self, shard: str) -> LocalShard | None:
        """`shard` if it is assigned to this member (`ShardService`'s host)."""
        return self.shards.items.get(shard)

    def primary_runner(self, shard: str) -> ShardRunner | None:
        """The runner of `shard` if this member is its primary (`AppServices`' host)."""
        local = self.local_shard(shard)
        return local.primary_runner if local is not None else None

    def status(self, shard: str) -> ReplicaStatus | None:
        """The shard's status on this member (None: not assigned here)."""
        local = self.shards.items.get(shard)
        return local.status if local is not None else None

    async def start(self) -> None:
        """Bind the port, join the group, serve the shards assigned here. On failure,
        whatever started is stopped again."""
        cfg = self.config
        await self.process.start(cfg.bind, cfg.port, serve=self._serve,
                                 run=self._run, stop=self.stop)
        log.info("consumer member %s of %s serving: gRPC %s, HTTP %s, brokers %s, etcd %s%s",
                 self.id, cfg.app_name, self.endpoint, self.http_url or "off",
                 cfg.broker_address, cfg.etcd_address, self.layout.root)

    async def _serve(self, grpc_server: grpc.aio.Server) -> MemberSpec:
        """The services, the HTTP listener and the parts the shards use; this member's
        spec."""
        cfg = self.config
        # Every service, the application's too (`AppServices`), refuses malformed
        # requests with INVALID_ARGUMENT naming the field.
        add_guarded(consumer_pb2_grpc.add_ShardServicer_to_server, ShardService(self),
                    grpc_server)
        routes = None
        if cfg.http_port >= 0:  # the application's routes need tokens, as its methods do
            routes = http_app(self.membership.ready, self.security.authorizer,
                              authorize_route)
        self.app.register(AppServices(self, grpc_server, routes))
        if routes is not None:
            self.http = HttpRunner(routes, grace=cfg.grace, log_name=__name__)
            try:
                self.http_port = await self.http.listen(
                    cfg.bind or None, cfg.http_port, self.security.http_context())
            except OSError as err:
                raise OSError(err.errno, f"cannot listen for HTTP on {cfg.bind or '*'}:"
                              f"{cfg.http_port}: {err.strerror}") from err
        self.client = JournalClient(cfg.broker_address, auth=self.security.client_auth())
        if cfg.local_dir:
            local_dir = Path(cfg.local_dir)
            try:
                await asyncio.to_thread(local_dir.mkdir, parents=True, exist_ok=True)
            except OSError as err:
                raise OSError(err.errno, f"consumer.local-dir {cfg.local_dir}: cannot "
                              f"make it: {err.strerror}") from err
        else:
            self._temp_dir = tempfile.TemporaryDirectory(prefix="gazette-consumer-")
            local_dir = Path(self._temp_dir.name)
        self.recovery = Recovery(self.etcd, local_dir)
        # Publishes and ACKs are messages: a repeat is dropped by readers, so an append
        # in doubt is sent again rather than failing the shard's transaction.
        self.appender = AppendQueue(self.client, resend=True)
        return MemberSpec(self.id, self.endpoint, cfg.shard_limit)

    async def _run(self) -> None:
        """Once joined: the tasks of liveness, routes and statuses, and the shards."""
        self.supervisor.spawn("liveness", lambda: self.membership.watch_liveness(
            self._liveness_changed))
        self.supervisor.spawn("announcer", self.announcer.run)
        self.supervisor.spawn("statuses", self.statuses.run)
        await self.shards.start()

    async def drain(self, timeout: float) -> bool:
        """Ask for no shards and wait until none that may hold state is assigned here (a
        shard never opened here holds none)."""
        return await self.membership.drain(
            lambda: self.shards.holding(self.resolver.assigned()), timeout)

    async def wait(self) -> None:
        """Return only when this member can no longer serve (raises why)."""
        await self.process.wait()

    async def stop(self) -> None:
        """Drain, stop serving, stop the shards, leave. Safe to call more than once."""
        http = self.http
        if not await self.process.stop(drain=self.drain, close=self._close,
                                       stop_http=http.cleanup if http is not None else None):
            return
        if self._temp_dir is not None:
            await asyncio.to_thread(self._temp_dir.cleanup)
            self._temp_dir = None
        log.info("consumer member %s stopped", self.id)

    async def _close(self) -> None:
        """The shards, their tasks, and the clients they used."""
        self.resolver.stop()
        await self.shards.close("the member is stopping")
        await self.supervisor.close()
        if self.appender is not None:
            try:  # bounded: what is not appended by then is appended again on recovery
                async with asyncio.timeout(APPENDS_STOP_SECONDS):
                    await self.appender.close()
            except TimeoutError:
                log.warning("stopping: %d bytes of appends still pending after %.0f s "
                            "(recovery replays their transactions or appends their ACKs again)",
                            self.appender.pending_bytes, APPENDS_STOP_SECONDS)
        if self.client is not None:
            await self.client.close()
        await self.channels.close()
