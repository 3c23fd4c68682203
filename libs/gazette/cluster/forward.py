"""Channels to other members, and requests forwarded to the member that serves an item.

Any member takes any request: one for an item served elsewhere is sent on to a member of
its route (the primary for writes; for reads one in this member's zone if any,
`Resolution.endpoint_near`) with ``do_not_proxy`` set and this member's header (`proxied`),
so the member that gets it answers itself or refuses, never forwarding again. What comes
back is passed through as received. A forward that fails aborts the caller's RPC with
the status the other member gave (a cancelled one as UNAVAILABLE: the caller may retry),
naming the member it went to.

A forward carries the caller's token, not this member's: the member that serves the item
authorizes the caller itself. Calls a member makes on its own behalf (a primary's
Replicate streams) carry its own token (`Channels.own`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import Message
from prometheus_client import Counter

from gazette.auth import ClientAuth, ServiceToken, TLSFiles, bearer, current_caller, open_channel
from gazette.client.wire import CHANNEL_OPTIONS, parse_address
from gazette.pb import broker_pb2 as pb

FORWARDED = Counter("gazette_forwarded_total",
                    "Requests forwarded to the member that serves their item", ["rpc"])

#: How long a forwarded request's answer is awaited once its request is sent.
PROXY_ANSWER_SECONDS = 60.0
#: A channel in its reconnect backoff (its member was down) is replaced by a new one,
#: which connects at once, at most this often: a member that restarts is reached as
#: soon as it listens, not after the rest of a backoff that grew while it was down.
RENEW_SECONDS = 0.5
#: Each channel has subchannels of its own (gRPC shares them between channels to one
#: address by default: a new channel would inherit the old one's backoff).
MEMBER_CHANNEL_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]

M = TypeVar("M", bound=Message)
R = TypeVar("R")


class Channels:
    """gRPC channels to other members, one per endpoint, closed together; over TLS
    with `tls` (opened again once its files change: a rotated client certificate), with
    no token of their own: each call says whose authority it carries (`own`, or the
    caller's `forward_unary`/`forward_stream` pass on)."""

    def __init__(self, tls: TLSFiles | None = None, token: ServiceToken | None = None
                 ) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._retired: list[grpc.aio.Channel] = []
        self._tls, self._token = tls, token
        self._signature = tls.signature() if tls is not None else ()
        self._renewed: dict[str, float] = {}  # endpoint -> when its channel was replaced
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, endpoint: str) -> grpc.aio.Channel:
        if self._tls is not None and self._tls.signature() != self._signature:
            self._signature = self._tls.signature()
            self._retired.extend(self._channels.values())  # in-flight calls finish
            self._channels.clear()
        channel = self._channels.get(endpoint)
        if channel is not None and channel.get_state() is \
                grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            now = asyncio.get_running_loop().time()
            if now - self._renewed.get(endpoint, -RENEW_SECONDS) >= RENEW_SECONDS:
                # Not connected, so no call is in flight on it: closed now.
                self._renewed[endpoint] = now
                closing = asyncio.create_task(channel.close(None))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
                channel = None
        if channel is None:
            channel = self._channels[endpoint] = open_channel(
                parse_address(endpoint), MEMBER_CHANNEL_OPTIONS, ClientAuth(self._tls))
        return channel

    def own(self) -> tuple[tuple[str, str], ...]:
        """The metadata of a call this member makes itself: its own token."""
        return bearer(self._token.current()) if self._token is not None else ()

    async def close(self) -> None:
        channels, self._channels = [*self._channels.values(), *self._retired], {}
        self._retired = []
        await asyncio.gather(*(c.close(grace=None) for c in channels), *self._closing,
                             return_exceptions=True)


def proxied(request: M, header: pb.Header) -> M:
    """A copy of `request` to send on: ``do_not_proxy`` set (requests without that field,
    such as a shard's Stat, say it by their header alone), and `header` (this member's
    resolution) pinning the revision the receiver must have reached."""
    out = type(request)()
    out.CopyFrom(request)
    if "do_not_proxy" in out.DESCRIPTOR.fields_by_name:
        out.do_not_proxy = True  # type: ignore[attr-defined]
    out.header.CopyFrom(header)  # type: ignore[attr-defined]
    return out


def rpc_name(method: str) -> str:
    """``/pkg.Service/Method`` -> ``Method`` (the label of `FORWARDED`)."""
    return method.rsplit("/", 1)[-1]


def _serialize(request: Message | bytes) -> bytes:
    return request if isinstance(request, bytes) else request.SerializeToString()


def _as_is(raw: bytes) -> bytes:
    return raw


async def _abort(context: Any, err: grpc.aio.AioRpcError, what: str, endpoint: str
                 ) -> NoReturn:
    code = err.code() if err.code() != grpc.StatusCode.CANCELLED \
        else grpc.StatusCode.UNAVAILABLE
    await context.abort(code, f"{what} via {endpoint}: {err.details()}")
    raise AssertionError("abort() raises")  # pragma: no cover


async def forward_unary(channels: Channels, endpoint: str, method: str,
                        request: Message | bytes, decode: Callable[[bytes], R],
                        context: Any, what: str) -> R:
    """The answer of the member at `endpoint` to `request` (see `proxied`); a failure
    aborts `context`'s RPC, saying `what` was being done."""
    FORWARDED.labels(rpc_name(method)).inc()
    call = channels.get(endpoint).unary_unary(
        method, request_serializer=_serialize, response_deserializer=decode)
    try:
        return await call(request, timeout=PROXY_ANSWER_SECONDS,  # type: ignore[no-any-return]
                          metadata=current_caller().metadata)
    except grpc.aio.AioRpcError as err:
        await _abort(context, err, what, endpoint)


async def forward_stream(channels: Channels, endpoint: str, method: str,
                         request: Message | bytes, context: Any, what: str
                         ) -> AsyncGenerator[bytes, None]:
    """The responses of the member at `endpoint` to `request`, serialized as received
    (nothing is decoded on the way); a failure aborts `context`'s RPC. Close it
    (``contextlib.aclosing``) so the call ends with the caller's."""
    FORWARDED.labels(rpc_name(method)).inc()
    call = channels.get(endpoint).unary_stream(
        method, request_serializer=_serialize, response_deserializer=_as_is)(
            request, metadata=current_caller().metadata)
    try:
        async for raw in call:
            yield raw
    except grpc.aio.AioRpcError as err:
        await _abort(context, err, what, endpoint)
    finally:
        call.cancel()
