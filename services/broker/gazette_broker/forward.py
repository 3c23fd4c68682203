"""Appends and reads sent on to the broker that serves their journal, over the broker's
shared channels to its peers, for both edges: the gRPC service passes the answers on,
the HTTP gateway turns them into its own.

A forward carries the caller's token (`current_caller`), so the broker that serves the
journal authorizes the caller itself, and this broker's header with ``do_not_proxy``, so
that broker answers itself or refuses, never forwarding again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator

import grpc

from gazette.auth import current_caller
from gazette.client import AppendUncertain
from gazette.cluster import FORWARDED, PROXY_ANSWER_SECONDS, Channels, proxied
from gazette.errors import GazetteError
from gazette.pb import broker_pb2 as pb
from gazette.protocol import APPEND_CONTENT_FIELD, ReadContent, Status, content_field
from gazette.protocol.content import decode_read_response
from gazette_broker.errors import StatusError

log = logging.getLogger(__name__)

APPEND_METHOD = "/gazette.broker.Journal/Append"
READ_METHOD = "/gazette.broker.Journal/Read"
FRAGMENTS_METHOD = "/gazette.broker.Journal/ListFragments"
#: Codes a broker answers a forwarded request with before it reads any content.
REFUSED_BEFORE_WRITING = frozenset({grpc.StatusCode.UNAUTHENTICATED,
                                    grpc.StatusCode.PERMISSION_DENIED})


class AppendAborted(Exception):
    """The append stream ended without its commit message: nothing was appended."""


class ForwardFailed(GazetteError):
    """The broker a request was forwarded to failed it with gRPC `code` (its own
    refusal of the caller, or a transport failure); `endpoint` names that broker. For
    an append, nothing was written unless the error is `AppendUncertain` instead."""

    def __init__(self, code: grpc.StatusCode, details: str, endpoint: str) -> None:
        self.code, self.details, self.endpoint = code, details, endpoint
        super().__init__(f"{code.name}: {details} (via {endpoint})")

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        return self.code not in REFUSED_BEFORE_WRITING


async def forward_append(channels: Channels, endpoint: str, meta: pb.AppendRequest,
                         header: pb.Header, content: AsyncIterator[bytes | memoryview]
                         ) -> pb.AppendResponse:
    """The answer of the primary at `endpoint` to the append of `content` under `meta`,
    streamed as it comes. A failure before the commit message was sent wrote nothing
    (`ForwardFailed`); after it, the outcome is unknown (`AppendUncertain`)."""
    FORWARDED.labels("Append").inc()
    call = channels.get(endpoint).stream_unary(
        APPEND_METHOD,  # requests are sent as serialized here
        response_deserializer=pb.AppendResponse.FromString)(  # type: ignore[call-arg]
            metadata=current_caller().metadata)  # the caller's authority, not ours
    first = proxied(meta, header)
    committing = False
    try:
        try:
            await call.write(first.SerializeToString())
            async for chunk in content:
                await call.write(b"".join(
                    content_field(APPEND_CONTENT_FIELD, [chunk], len(chunk))))
            committing = True
            await call.write(b"")  # the commit
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the primary may have answered early: its answer is the outcome
        async with asyncio.timeout(PROXY_ANSWER_SECONDS):
            return await call  # type: ignore[no-any-return]
    except (grpc.aio.AioRpcError, TimeoutError) as err:
        code, why = (err.code(), err.details() or "") if isinstance(
            err, grpc.aio.AioRpcError) else (grpc.StatusCode.DEADLINE_EXCEEDED,
                                             "no answer in time")
        if code in REFUSED_BEFORE_WRITING or not committing:
            log.info("forwarding an append of %s to %s failed (%s: %s); nothing was "
                     "appended", meta.journal, endpoint, code.name, why)
            raise ForwardFailed(code, why, endpoint) from None
        raise AppendUncertain(meta.journal, f"forwarding it to its primary at {endpoint} "
                              f"failed after its commit ({code.name}: {why})") from None
    except BaseException:
        call.cancel()
        raise


async def forward_read(channels: Channels, endpoint: str, request: pb.ReadRequest,
                       header: pb.Header) -> AsyncGenerator[ReadContent, None]:
    """The responses with content of the broker at `endpoint` to `request`, decoded; a
    status other than OK raises `StatusError` (OFFSET_NOT_YET_AVAILABLE of a
    non-blocking read ends it), a failed call `ForwardFailed`. Close it
    (``contextlib.aclosing``) so the call ends with the caller's."""
    FORWARDED.labels("Read").inc()
    call = channels.get(endpoint).unary_stream(
        READ_METHOD, request_serializer=pb.ReadRequest.SerializeToString,
        response_deserializer=decode_read_response)(
            proxied(request, header), metadata=current_caller().metadata)
    try:
        async for part in call:
            status = Status.of(part.meta.status)
            if status is not Status.OK:
                if status is Status.OFFSET_NOT_YET_AVAILABLE and not request.block:
                    return
                raise StatusError(status, f"reading {request.journal} from offset "
                                  f"{request.offset} via {endpoint}")
            if part.content:
                yield part
    except grpc.aio.AioRpcError as err:
        raise ForwardFailed(err.code(), err.details() or "", endpoint) from None
    finally:
        call.cancel()
