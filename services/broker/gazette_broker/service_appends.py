"""Append, AppendWhole and Replicate: an append is taken here if this broker is the
journal's primary, else forwarded to it as a stream (a failure before the commit message
is known to have written nothing); a primary's Replicate stream is checked against this
broker's route of the journal, then served by the replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from gazette import names
from gazette.allocator import route_from_pb
from gazette.auth import current_caller
from gazette.client import AppendUncertain
from gazette.cluster import (
    FORWARDED,
    PROXY_ANSWER_SECONDS,
    Resolution,
    proxied,
)
from gazette.errors import ValidationError
from gazette.fragment import fragment_to_pb
from gazette.pb import broker_pb2 as pb
from gazette.protocol import (
    APPEND_CONTENT_FIELD,
    AppendContent,
    JournalSpec,
    ReplicateContent,
    content_field,
    labels_from_pb,
    labels_to_pb,
    selector_from_pb,
)
from gazette_broker.errors import AppendError, AppendStalled
from gazette_broker.service_routing import JournalRouting

log = logging.getLogger(__name__)

class AppendAborted(Exception):
    """The append stream ended without its commit message."""


APPEND_METHOD = "/gazette.broker.Journal/Append"
#: Codes a primary answers a forwarded append with before it reads any content.
REFUSED_BEFORE_WRITING = frozenset({grpc.StatusCode.UNAUTHENTICATED,
                                    grpc.StatusCode.PERMISSION_DENIED})


class AppendRpcs(JournalRouting):
    """The Append, AppendWhole and Replicate RPCs."""

    async def Append(  # AppendContent: see add_journal_service
            self, request_iterator: AsyncIterator[AppendContent], context: Any,
    ) -> pb.AppendResponse:
        requests = request_iterator.__aiter__()
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty append stream")
        if first.content:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "content: the first message carries metadata only")

        async def content() -> AsyncIterator[bytes | memoryview]:
            async for req in requests:
                if not req.content:
                    return  # the commit message
                yield req.content
            raise AppendAborted("the append stream ended without its commit message")

        return await self._append(first.meta, content(), context)

    async def AppendWhole(  # AppendContent: as Append
            self, request: AppendContent, context: Any) -> pb.AppendResponse:
        if not request.content:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "content: an AppendWhole request carries the content")
        return await self._append(request.meta, _one(request.content), context)

    async def _append(self, meta: pb.AppendRequest, content: AsyncIterator[bytes | memoryview],
                      context: Any) -> pb.AppendResponse:
        """The append of `content` under the metadata of `meta` (journal, expected
        offset, registers): here if this broker is the primary, else forwarded to it."""
        res, replica = await self._resolve(
            meta.journal, meta.header if meta.HasField("header") else None, context)
        header = self._header(res=res) if res is not None else None
        if res is not None and (replica is None or not replica.is_primary):
            if res.spec is None:
                return pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND, header=header)
            if meta.do_not_proxy:
                return pb.AppendResponse(status=pb.NOT_JOURNAL_PRIMARY_BROKER, header=header)
            if not res.primary_endpoint or res.route.primary_id == self.resolver.me:  # type: ignore[union-attr]
                return pb.AppendResponse(status=pb.NO_JOURNAL_PRIMARY_BROKER, header=header)
            try:
                return await self._forward_append(res, meta, content, context)
            except AppendAborted as err:
                await context.abort(grpc.StatusCode.CANCELLED, f"{err}: nothing was appended")
        if replica is None:
            return pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND, header=header)
        try:
            check = (selector_from_pb(meta.check_registers, "check_registers")
                     if meta.HasField("check_registers") else None)
            union = labels_from_pb(meta.union_registers, "union_registers")
            subtract = labels_from_pb(meta.subtract_registers, "subtract_registers")
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        try:
            result = await replica.append(
                content, offset=meta.offset or None, check_registers=check,
                union_registers=union or None, subtract_registers=subtract or None)
        except AppendError as err:
            return pb.AppendResponse(status=pb.Status.Value(err.status), header=header,
                                     detail=err.message)
        except AppendUncertain as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        except AppendAborted as err:
            await context.abort(grpc.StatusCode.CANCELLED, f"{err}: nothing was appended")
        except AppendStalled as err:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(err))
        return pb.AppendResponse(status=pb.OK, header=header,
                                 commit=fragment_to_pb(result.commit),
                                 registers=labels_to_pb(result.registers))

    async def _forward_append(self, res: Resolution[JournalSpec], meta: pb.AppendRequest,
                              content: AsyncIterator[bytes | memoryview], context: Any
                              ) -> pb.AppendResponse:
        """Forward the append to the journal's primary as a stream (so a failure before
        the commit message is known to have written nothing: NO_JOURNAL_PRIMARY_BROKER,
        retried by clients; after it, the outcome is unknown: UNAVAILABLE)."""
        FORWARDED.labels("Append").inc()
        call = self._forwarding.get(res.primary_endpoint).stream_unary(
            APPEND_METHOD,  # requests are sent as serialized here
            response_deserializer=pb.AppendResponse.FromString)(  # type: ignore[call-arg]
                metadata=current_caller().metadata)  # the caller's authority, not ours
        first = proxied(meta, self._header(res=res))
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
            why = f"{err.code().name}: {err.details()}" if isinstance(
                err, grpc.aio.AioRpcError) else "no answer in time"
            if isinstance(err, grpc.aio.AioRpcError) and err.code() in REFUSED_BEFORE_WRITING:
                # The primary refused the caller before reading a byte (its token).
                await context.abort(err.code(), f"{err.details()} (via "
                                    f"{res.primary_endpoint})")
            if not committing:
                log.info("forwarding an append of %s to %s failed (%s); nothing was "
                         "appended", meta.journal, res.primary_endpoint, why)
                return pb.AppendResponse(status=pb.NO_JOURNAL_PRIMARY_BROKER,
                                         header=self._header(res=res))
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"forwarding the append of {meta.journal} to its primary "
                                f"at {res.primary_endpoint} failed after its commit ({why}): "
                                "the append may or may not have committed")
        except BaseException:
            call.cancel()
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def Replicate(self, request_iterator: AsyncIterator[ReplicateContent],
                        context: Any) -> None:
        """A primary's replication stream to this broker: its first message's header
        must carry the route this broker has for the journal (after catching up with
        its revision), else WRONG_ROUTE; then the replica serves it."""
        if self.resolver is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "this broker is not part of a cluster: it has no peers")
        assert self.resolver is not None
        requests = request_iterator.__aiter__()
        try:
            first = (await anext(requests)).meta
        except StopAsyncIteration:
            return
        try:
            names.validate_journal_name(first.journal, "journal")
            theirs = route_from_pb(first.header.route)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        res, replica = await self._resolve(first.journal, first.header, context)
        assert res is not None
        if res.route != theirs.with_endpoints(()):
            log.info("replication of %s refused: its route %s is not ours %s (revision %d)",
                     first.journal, theirs, res.route, res.revision)
            await context.write(pb.ReplicateResponse(status=pb.WRONG_ROUTE,
                                                     header=self._header(res=res)))
            return
        if replica is None:
            await context.write(pb.ReplicateResponse(status=pb.NOT_JOURNAL_BROKER,
                                                     header=self._header(res=res)))
            return
        try:
            await replica.replicate(first, requests, context.write)
        except ValidationError as err:  # a malformed proposal: nothing was committed
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


async def _one(content: bytes | memoryview) -> AsyncIterator[bytes | memoryview]:
    yield content
