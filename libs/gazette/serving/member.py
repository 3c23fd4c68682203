"""The start and stop sequence every member process shares (a broker, a consumer member),
around the parts only it has.

A `MemberProcess` starts a member: its gRPC server bound first (a port in use fails at
once, before any wait for etcd), with the health service; then the process's own
services and listeners; then etcd, the member spec under a lease (`Membership.join`);
then the process's own supervised tasks; then the allocator, and the gRPC server serves
with health SERVING. A start that fails stops whatever started. It stops a member in
the reverse order: a drain (the member asks for nothing, and waits until what it held
moved elsewhere), health NOT_SERVING, the gRPC and HTTP listeners given `grace` seconds
for what is in flight, the process's own parts closed, and the member spec removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from gazette.auth import MemberSecurity
from gazette.cluster import Membership
from gazette.keyspace import Etcd
from gazette.protocol import MemberSpec
from gazette.serving.grpc_listener import grpc_server_on
from gazette.serving.malformed_guard import add_guarded
from gazette.supervise import Supervisor

log = logging.getLogger(__name__)


def default_member_suffix(fallback: str) -> str:
    """A unique-enough member name: the host name and a random tag."""
    host = "".join(ch if ch.isalnum() or ch in "-_." else "-"
                   for ch in socket.gethostname())[:100] or fallback
    return f"{host}-{secrets.token_hex(3)}"


class MemberProcess:
    """The shared skeleton of one member process: its gRPC server and health service,
    its start (`start`) and its stop (`stop`), given what the process does in between.
    `what` names the member in messages ("broker", "consumer member"); `services` are the
    gRPC services health reports SERVING besides the server as a whole."""

    def __init__(self, what: str, etcd: Etcd, membership: Membership,
                 security: MemberSecurity, supervisor: Supervisor, *, grace: float,
                 drain_timeout: float, services: Sequence[str] = ()) -> None:
        self.what = what
        self.etcd, self.membership, self.security = etcd, membership, security
        self.supervisor = supervisor
        self.grace, self.drain_timeout = grace, drain_timeout
        self.services = tuple(services)
        self.health = HealthServicer()
        self.grpc_server: grpc.aio.Server | None = None
        self.port = 0
        self.started = False

    async def start(self, bind: str, port: int, *,
                    serve: Callable[[grpc.aio.Server], Awaitable[MemberSpec]],
                    run: Callable[[], Awaitable[None]],
                    stop: Callable[[], Awaitable[None]]) -> None:
        """Bind the gRPC port (`port` 0: a free one, then `self.port`), then `serve`
        (the process adds its services and listeners: returns its member spec), connect
        to etcd and join under a lease, `run` (the process's own tasks), run the
        allocator and serve. On failure `stop` (the process's whole stop) runs."""
        self.started = True
        try:
            server, self.port = grpc_server_on(
                bind, port, self.what, self.security.server_credentials(),
                self.security.interceptors())
            self.grpc_server = server
            # Malformed health checks too: INVALID_ARGUMENT naming the field.
            add_guarded(health_pb2_grpc.add_HealthServicer_to_server, self.health, server)
            spec = await serve(server)
            await self.etcd.connect()
            deadline = self.membership.deadline()
            await self.membership.load(deadline)
            # The member sees itself before it serves (the allocator counts it).
            await self.membership.join(spec, self.supervisor, deadline)
            await run()
            self.membership.run_allocator(self.supervisor)
            await server.start()
            for service in ("", *self.services):
                await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        except BaseException:
            await stop()
            raise

    async def wait(self) -> None:
        """Return only when the member can no longer serve: its lease is lost (raises
        `LeaseLost`), or a task it cannot do without failed for good (`TaskFailed`)."""
        await self.membership.wait(self.supervisor)

    async def stop(self, *, drain: Callable[[float], Awaitable[bool]],
                   close: Callable[[], Awaitable[None]],
                   stop_http: Callable[[], Awaitable[object]] | None = None) -> bool:
        """Drain (`drain`, while the lease holds), stop serving (health NOT_SERVING, the
        gRPC server and `stop_http` give what is in flight `grace` seconds), `close` the
        process's own parts, and leave (the member spec goes with its lease). False if
        the member was not started (or is stopped already): nothing to do."""
        if not self.started:
            return False
        self.started = False
        if self.membership.ready():
            try:
                await drain(self.drain_timeout)
            except Exception as err:  # noqa: BLE001 - stopping goes on regardless
                log.warning("draining failed: %s", err)
        with contextlib.suppress(Exception):
            await self.health.enter_graceful_shutdown()
        stopping: list[Awaitable[object]] = []
        if self.grpc_server is not None:
            stopping.append(self.grpc_server.stop(grace=self.grace))
        if stop_http is not None:
            stopping.append(stop_http())
        await asyncio.gather(*stopping, return_exceptions=True)
        await close()
        await self.membership.leave()
        return True
