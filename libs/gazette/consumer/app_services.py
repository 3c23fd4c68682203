"""An application's own APIs on its members: gRPC methods routed to a shard's primary,
and HTTP routes.

A query of a shard's state (a word's count, a user's balance) must be answered by the
member where that shard runs as primary, but clients should not need to know which one
that is. `AppServices.add_shard_method` registers a unary gRPC method whose request names
its shard (`shard_of`): any member takes it, runs the handler with the shard's live
store if it is the primary, and else forwards the request, as received, to the primary
(once: a forwarded request that finds no primary fails with UNAVAILABLE, which a client
may retry). Requests and answers are bytes: the application picks the encoding (JSON,
protobuf); a request its `shard_of` cannot read (whatever it raises) is INVALID_ARGUMENT.
HTTP routes (``services.http``, an aiohttp application, when the member serves HTTP) call
the same methods with `call`.

Every service an application adds to ``services.grpc_server`` is behind the member's
malformed-request guard (`gazette.serving.malformed_guard.GuardedServer`) and interceptors.
With authorization on, its methods, the shard methods and the HTTP routes alike need a
token granting ``shard-call`` (`authorize_route` on HTTP); a shard method's shard must be
in the token's selector, on the member that takes the call and on the primary it is
forwarded to with the caller's token.

An application registers them in ``Application.register(services)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import grpc
from aiohttp import web

from gazette import names
from gazette.auth import (
    AuthError,
    Caller,
    Capability,
    PermissionDenied,
    Unauthenticated,
    abort_refused,
    current_caller,
)
from gazette.cluster import FORWARDED, Channels, Resolver
from gazette.consumer.app_shard import Shard
from gazette.consumer.store import Store
from gazette.errors import ValidationError, short_repr
from gazette.labels import EMPTY, shard_labels
from gazette.protocol import ShardSpec
from gazette.serving.malformed_guard import GuardedServer

#: Metadata a forwarded request carries (the receiver answers itself or refuses).
FORWARDED_KEY = "gazette-forwarded"
#: Deadline of a call when its caller set none.
CALL_SECONDS = 30.0

ShardHandler = Callable[[Shard, Any, bytes], Awaitable[bytes]]
"""Answers a request from the shard (its handle and its store) this member runs."""


class PrimaryRunner(Protocol):
    """A shard's runner on a member that is its primary (a `ShardRunner`): the shard's
    handle, and its live store while it is restored."""

    @property
    def shard(self) -> Shard: ...

    @property
    def store(self) -> Store | None: ...


class AppServicesHost(Protocol):
    """What `AppServices` needs of its member (a `ConsumerMember`): the routes of
    shards, channels to the other members, and the runners of the shards it is the
    primary of."""

    @property
    def resolver(self) -> Resolver[ShardSpec]: ...

    @property
    def channels(self) -> Channels: ...

    def primary_runner(self, shard: str) -> PrimaryRunner | None:
        """The runner of `shard` if this member runs it as primary."""


class NoShardPrimary(Exception):
    """The shard has no primary now (or is not known): retry later."""


def authorize_route(request: web.Request, caller: Caller) -> None:
    """An application's HTTP route needs ``shard-call``, as its gRPC methods do (the
    member's `gazette.cluster.http_app` check); the shard a route reaches through
    `AppServices.call` must also be in the token's selector."""
    caller.claims.require(Capability.SHARD_CALL,
                          f"{request.method} {short_repr(request.path)}")


@dataclass(frozen=True)
class _Method:
    handler: ShardHandler
    shard_of: Callable[[bytes], str]


class AppServices:
    """What `Application.register` gets: `grpc_server` (add servicers to it: each is
    guarded, see the module's doc), `http` (an aiohttp application, None when the member
    serves no HTTP), and shard methods."""

    def __init__(self, host: AppServicesHost, grpc_server: grpc.aio.Server,
                 http: web.Application | None) -> None:
        self._host = host
        self.grpc_server = cast(grpc.aio.Server, GuardedServer(grpc_server))
        self.http = http
        self._methods: dict[str, _Method] = {}

    def add_shard_method(self, service: str, method: str, handler: ShardHandler,
                         shard_of: Callable[[bytes], str]) -> str:
        """Serve ``/{service}/{method}``: `shard_of(request)` names the shard whose
        primary answers with `handler`. Returns the method's path (for `call`)."""
        path = f"/{service}/{method}"
        self._methods[path] = _Method(handler, shard_of)

        async def serve(request: bytes, context: grpc.aio.ServicerContext[Any, Any]
                        ) -> bytes:
            forwarded = any(k == FORWARDED_KEY for k, _ in
                            (context.invocation_metadata() or ()))
            remaining = context.time_remaining()
            try:
                return await self._answer(path, request, forwarded,
                                          CALL_SECONDS if remaining is None else remaining)
            except ValidationError as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            except NoShardPrimary as err:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            except AuthError as err:
                await abort_refused(context, err)
            except grpc.aio.AioRpcError as err:
                await context.abort(err.code(), err.details() or "")
            raise AssertionError("abort() raises")  # pragma: no cover

        self.grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            service, {method: grpc.unary_unary_rpc_method_handler(serve)}),))
        return path

    async def call(self, path: str, request: bytes, timeout: float = CALL_SECONDS) -> bytes:
        """Call a shard method for the request being served (an HTTP route, say; its
        caller's token must cover the shard): answered here or by the shard's primary.
        Raises `ValidationError` (a bad request), `gazette.auth.AuthError` (refused:
        the member's HTTP application answers 401 or 403), `NoShardPrimary`, or the
        primary's `grpc.aio.AioRpcError`."""
        return await self._answer(path, request, False, timeout)

    async def _answer(self, path: str, request: bytes, forwarded: bool,
                      timeout: float) -> bytes:
        method = self._methods[path]
        shard_id = _shard_of(method, request)
        host = self._host
        claims = current_caller().claims
        if claims.scoped:
            spec = host.resolver.resolve(shard_id).spec
            claims.require_scope(shard_labels(
                shard_id, spec.labels if spec is not None else EMPTY), f"shard {shard_id}")
        runner = host.primary_runner(shard_id)
        if runner is not None and runner.store is not None:
            async with asyncio.timeout(timeout):
                return await method.handler(runner.shard, runner.store, request)
        res = host.resolver.resolve(shard_id)
        if res.spec is None:
            raise ValidationError("shard", f"no shard {shard_id!r}")
        endpoint = res.primary_endpoint
        if forwarded or not endpoint or res.route.primary_id == host.resolver.me:
            raise NoShardPrimary(f"shard {shard_id} has no running primary (route "
                                   f"{res.route}); retry")
        FORWARDED.labels(path.rsplit("/", 1)[-1]).inc()
        call = host.channels.get(endpoint).unary_unary(
            path, request_serializer=None, response_deserializer=None)
        try:
            answer: bytes = await call(request, timeout=timeout,
                                       metadata=((FORWARDED_KEY, "1"),
                                                 *current_caller().metadata))
        except grpc.aio.AioRpcError as err:
            refusal = _REFUSALS.get(err.code())
            if refusal is not None:  # the primary's refusal of this caller
                raise refusal(err.details() or err.code().name) from None
            raise
        return answer


_REFUSALS: dict[grpc.StatusCode, type[AuthError]] = {
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


def _shard_of(method: _Method, request: bytes) -> str:
    """The shard a request names, by the application's `shard_of`: whatever that raises
    reading it (deeply nested JSON's RecursionError, say) is a `ValidationError`."""
    try:
        shard = method.shard_of(request)
    except ValidationError:
        raise
    except Exception as err:  # noqa: BLE001 - a request the application cannot read
        raise ValidationError("request", f"cannot tell its shard ({type(err).__name__}: "
                              f"{short_repr(str(err))})") from None
    return names.validate_shard_id(shard, "shard")
