"""The connection a `JournalClient` holds to a broker: its gRPC channel and stubs, retry
policy and request timeout, the checks of arguments every request shares, and the
append calls of a channel (the client's own, or a primary's)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Self

import grpc

from gazette.auth import PLAIN, ClientAuth, auth_for, open_channel
from gazette.client.errors import Unavailable
from gazette.client.retry import (
    Backoff,
    RetryPolicy,
)
from gazette.client.wire import (
    CHANNEL_OPTIONS,
    Content,
    WholeAppend,
    encode_append,
    parse_address,
)
from gazette.errors import ValidationError, short_repr
from gazette.labels import Selector
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol.content import ReadContent, decode_read_response

log = logging.getLogger(__name__)


def _selector(selector: Selector | str) -> Selector:
    if isinstance(selector, Selector):
        return selector
    if not isinstance(selector, str):
        raise ValidationError("selector", f"expected a Selector or str, got "
                              f"{type(selector).__name__}")
    return Selector.parse(selector) if selector.strip() else Selector()


def _not_str(content: object) -> None:
    if isinstance(content, str):
        raise ValidationError("content", "expected bytes, got str (encode it first)")


#: The protocol's offsets and times are int64: past this, protobuf fails with a bare
#: ValueError from deep inside a request.
MAX_INT64 = 2**63 - 1


def _check_offset(value: object, field: str, lo: int, hi: int = MAX_INT64) -> int:
    """`value` as an int in ``lo..hi``; ValidationError naming `field` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValidationError(field, f"expected an int >= {lo}, got {short_repr(value)}")
    if value > hi:
        raise ValidationError(field, f"must be at most {hi}, got {short_repr(value)}")
    return value


def checked_settings(retry: RetryPolicy | None, timeout: float,
                     channel_options: Sequence[tuple[str, Any]]
                     ) -> tuple[RetryPolicy, float, list[tuple[str, Any]]]:
    """A client's retry policy, deadline and channel options (ours, overridden by the
    caller's), each checked: what a journal client and a shard client both take."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ValidationError("retry", f"expected a RetryPolicy, got {type(retry).__name__}")
    if not timeout > 0:
        raise ValidationError("timeout", f"must be > 0 seconds, got {timeout!r}")
    options = dict(CHANNEL_OPTIONS)
    options.update(dict(channel_options))
    return retry or RetryPolicy(), timeout, list(options.items())


def checked_auth(auth: object, address: str = "") -> ClientAuth:
    """A client's `ClientAuth` (None: plain text, no token), checked, as `address`'s
    scheme asks (`auth_for`: https:// is TLS)."""
    if auth is None:
        auth = PLAIN
    if not isinstance(auth, ClientAuth):
        raise ValidationError("auth", f"expected a ClientAuth, got {type(auth).__name__}")
    return auth_for(address, auth)


class _Appender:
    """The append calls of one channel (the client's own, or a primary's)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.stream: grpc.aio.StreamUnaryMultiCallable[
            Content | pb.AppendRequest, pb.AppendResponse] = channel.stream_unary(
                "/gazette.broker.Journal/Append", request_serializer=encode_append,
                response_deserializer=pb.AppendResponse.FromString)
        self.whole: grpc.aio.UnaryUnaryMultiCallable[
            WholeAppend, pb.AppendResponse] = channel.unary_unary(
                "/gazette.broker.Journal/AppendWhole", request_serializer=encode_append,
                response_deserializer=pb.AppendResponse.FromString)


class Connection:
    """A broker's address, channel and stubs; what `JournalClient` is built on."""

    def __init__(self, address: str, *, retry: RetryPolicy | None = None,
                 channel_options: Sequence[tuple[str, Any]] = (),
                 timeout: float = 30.0, route_appends: bool = False,
                 auth: ClientAuth | None = None) -> None:
        self.address = parse_address(address)
        self.route_appends = route_appends
        self.retry, self.timeout, self._options = checked_settings(retry, timeout,
                                                                   channel_options)
        #: TLS and the bearer token every call presents.
        self.auth = checked_auth(auth, address)
        self._channel = open_channel(self.address, self._options, self.auth)
        self._stub = broker_pb2_grpc.JournalStub(self._channel)
        self._closed = False
        self._broker = _Appender(self._channel)
        #: With `route_appends`: journal -> its primary's gRPC target, and an appender
        #: per target.
        self._primaries: dict[str, str] = {}
        self._appenders: dict[str, _Appender] = {}
        self._read_rpc: grpc.aio.UnaryStreamMultiCallable[
            pb.ReadRequest, ReadContent] = self._channel.unary_stream(
                "/gazette.broker.Journal/Read",
                request_serializer=pb.ReadRequest.SerializeToString,
                response_deserializer=decode_read_response)
        #: Cleared when the broker does not know AppendWhole (an older version).
        self._whole_appends = True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r})"

    async def close(self) -> None:
        """Close the channel: RPCs still running end with `Unavailable` (code CLOSED),
        and so do calls made afterwards."""
        self._closed = True
        await asyncio.gather(self._channel.close(None),
                             *(a.channel.close(None) for a in self._appenders.values()))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _backoff(self, op: str, journal: str = "") -> Backoff:
        if self._closed:
            raise Unavailable(op, self.address, "CLOSED", "the client was closed", journal)
        return Backoff(self.retry, op, self.address, journal, lambda: self._closed)


def _ended_early(journal: str) -> grpc.aio.AioRpcError:
    """A stream that ended where the protocol promises more: retried like a dropped
    connection (a broker shutting down ends streams this way)."""
    where = f" (reading {journal})" if journal else ""
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), f"the broker ended the stream early{where}",
                                None)
