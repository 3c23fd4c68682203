"""Append, AppendWhole and Replicate: an append is taken here if this broker is the
journal's primary, else forwarded to it as a stream (a failure before the commit message
is known to have written nothing); a primary's Replicate stream is checked against this
broker's route of the journal, then served by the replica.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from gazette import names
from gazette.allocator import route_from_pb
from gazette.client import AppendUncertain
from gazette.errors import ValidationError
from gazette.fragment import fragment_to_pb
from gazette.pb import broker_pb2 as pb
from gazette.protocol import (
    AppendContent,
    ReplicateContent,
    labels_from_pb,
    labels_to_pb,
    selector_from_pb,
)
from gazette_broker.errors import AppendError, AppendStalled
from gazette_broker.forward import AppendAborted, ForwardFailed, forward_append
from gazette_broker.routing import JournalRouting, Refused
from gazette_broker.service_routing import pinned, resolved

log = logging.getLogger(__name__)


class AppendRpcs:
    """The Append, AppendWhole and Replicate RPCs over `routing`."""

    def __init__(self, routing: JournalRouting) -> None:
        self.routing = routing

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

        return await self.append(first.meta, content(), context)

    async def AppendWhole(  # AppendContent: as Append
            self, request: AppendContent, context: Any) -> pb.AppendResponse:
        if not request.content:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "content: an AppendWhole request carries the content")
        return await self.append(request.meta, _one(request.content), context)

    async def append(self, meta: pb.AppendRequest, content: AsyncIterator[bytes | memoryview],
                     context: Any, *, sum_content: bool = True) -> pb.AppendResponse:
        """The append of `content` under the metadata of `meta` (journal, expected
        offset, registers): here if this broker is the primary, else forwarded to it.
        Refusals end `context` (`context.abort`, as a gRPC call's: the data path's
        raises its own). Without `sum_content`, a commit made here carries no SHA-1 of
        the content (`NO_SHA1`: the data path checked its CRC-32 instead)."""
        routing = self.routing
        routed = await resolved(routing, meta.journal, pinned(meta), context)
        header = routing.header(res=routed.res) if routed.res is not None else None
        try:
            target = routing.append_target(routed, forward=not meta.do_not_proxy)
        except Refused as err:
            return pb.AppendResponse(status=err.status.code, header=header)
        try:
            if isinstance(target, str):
                assert routed.res is not None
                return await forward_append(routing.forwarding, target, meta,
                                            routing.header(res=routed.res), content)
            check = (selector_from_pb(meta.check_registers, "check_registers")
                     if meta.HasField("check_registers") else None)
            union = labels_from_pb(meta.union_registers, "union_registers")
            subtract = labels_from_pb(meta.subtract_registers, "subtract_registers")
            result = await target.append(
                content, offset=meta.offset or None, check_registers=check,
                union_registers=union or None, subtract_registers=subtract or None,
                sum_content=sum_content)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except AppendError as err:
            return pb.AppendResponse(status=err.status.code, header=header,
                                     detail=err.message)
        except ForwardFailed as err:
            if not err.retriable:  # the primary refused the caller (its token)
                await context.abort(err.code, f"{err.details} (via {err.endpoint})")
            return pb.AppendResponse(status=pb.NO_JOURNAL_PRIMARY_BROKER, header=header)
        except AppendUncertain as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        except AppendAborted as err:
            await context.abort(grpc.StatusCode.CANCELLED, f"{err}: nothing was appended")
        except AppendStalled as err:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(err))
        return pb.AppendResponse(status=pb.OK, header=header,
                                 commit=fragment_to_pb(result.commit),
                                 registers=labels_to_pb(result.registers))

    async def Replicate(self, request_iterator: AsyncIterator[ReplicateContent],
                        context: Any) -> None:
        """A primary's replication stream to this broker: its first message's header
        must carry the route this broker has for the journal (after catching up with
        its revision), else WRONG_ROUTE; then the replica serves it."""
        routing = self.routing
        if routing.resolver is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "this broker is not part of a cluster: it has no peers")
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
        routed = await resolved(routing, first.journal, first.header, context)
        res, replica = routed.res, routed.replica
        assert res is not None
        if res.route != theirs.with_endpoints(()):
            log.info("replication of %s refused: its route %s is not ours %s (revision %d)",
                     first.journal, theirs, res.route, res.revision)
            await context.write(pb.ReplicateResponse(status=pb.WRONG_ROUTE,
                                                     header=routing.header(res=res)))
            return
        if replica is None:
            await context.write(pb.ReplicateResponse(status=pb.NOT_JOURNAL_BROKER,
                                                     header=routing.header(res=res)))
            return
        try:
            await replica.replicate(first, requests, context.write)
        except ValidationError as err:  # a malformed proposal: nothing was committed
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


async def _one(content: bytes | memoryview) -> AsyncIterator[bytes | memoryview]:
    yield content
