"""Read and ListFragments: served by this broker's replica of the journal, else
forwarded to a replica (one in this zone if any); metadata-only reads of persisted
fragments answer with a signed URL, so clients fetch the bytes from the store.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc

from gazette.cluster import (
    CLOSED_DELETED,
    forward_stream,
    forward_unary,
    proxied,
)
from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment, JournalClosed, fragment_to_pb
from gazette.fragment.store import StoreError
from gazette.pb import broker_pb2 as pb
from gazette.protocol import ReadContent, duration_from_pb
from gazette_broker.errors import StatusError
from gazette_broker.forward import FRAGMENTS_METHOD, READ_METHOD, ForwardFailed
from gazette_broker.replica import Replica
from gazette_broker.replica_reads import replica_chunks
from gazette_broker.routing import JournalRouting, Refused
from gazette_broker.service_routing import pinned, resolved

log = logging.getLogger(__name__)

#: How long the fragment URLs of metadata-only reads stay valid.
READ_SIGNATURE_TTL = timedelta(hours=1)
#: Fragments per ListFragments page unless the request asks for fewer.
DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT = 1000, 10_000


class ReadRpcs:
    """The Read and ListFragments RPCs over `routing`."""

    def __init__(self, routing: JournalRouting) -> None:
        self.routing = routing

    async def Read(  # ReadContent: see add_journal_service
            self, request: pb.ReadRequest, context: Any,
    ) -> AsyncIterator[pb.ReadResponse | ReadContent | bytes]:
        routing = self.routing
        routed = await resolved(routing, request.journal, pinned(request), context)
        try:
            replica = routing.read_target(routed, forward=not request.do_not_proxy)
        except Refused as err:
            yield pb.ReadResponse(status=err.status.code, header=routing.header(res=err.res))
            return
        if isinstance(replica, str):
            # Passed on as received. Generators are closed here, when the read ends or
            # is cancelled, not later by the garbage collector.
            assert routed.res is not None
            async with contextlib.aclosing(forward_stream(
                    routing.forwarding, replica, READ_METHOD,
                    proxied(request, routing.header(res=routed.res)), context,
                    f"reading {request.journal}")) as forwarded:
                async for raw in forwarded:
                    yield raw
            return
        try:
            if request.metadata_only:
                yield await self._read_metadata(replica, request)
                return
            first = True
            async with contextlib.aclosing(replica_chunks(
                    routing, replica, request.offset, block=request.block,
                    end=request.end_offset, forward=not request.do_not_proxy)) as chunks:
                async for chunk in chunks:
                    yield ReadContent(pb.ReadResponse(
                        status=pb.OK, header=self.routing.header() if first else None,
                        offset=chunk.offset, write_head=chunk.write_head,
                        fragment=fragment_to_pb(chunk.fragment)), chunk.content)
                    first = False
        except StatusError as err:  # the replica's refusal, or the primary's of a gap
            yield pb.ReadResponse(status=err.status.code, write_head=replica.write_head)
        except ForwardFailed as err:  # a gap's read from the primary: the client retries
            await context.abort(err.code, str(err))
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except JournalClosed as err:
            if replica.closed == CLOSED_DELETED:
                yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND)
            else:  # moved to other brokers: the client reads on there
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"{err}: read on through another broker")
        except CorruptFragment as err:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(err))
        except StoreError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))

    async def _read_metadata(self, replica: Replica, request: pb.ReadRequest
                             ) -> pb.ReadResponse:
        """The one response of a metadata-only read: where the read starts, the fragment
        holding it, and, if that fragment is only in a store, a signed URL to fetch it
        from (the client then reads it there, sparing this broker the bytes)."""
        offset, frag = await replica.locate(request.offset, block=request.block)
        url = await replica.sign(frag, READ_SIGNATURE_TTL) if replica.is_remote(frag) else ""
        return pb.ReadResponse(status=pb.OK, header=self.routing.header(), offset=offset,
                               write_head=replica.write_head,
                               fragment=fragment_to_pb(frag), fragment_url=url)

    async def ListFragments(self, request: pb.FragmentsRequest, context: Any
                            ) -> pb.FragmentsResponse:
        routing = self.routing
        routed = await resolved(routing, request.journal, pinned(request), context)
        try:
            replica = routing.read_target(routed, forward=not request.do_not_proxy)
        except Refused as err:
            return pb.FragmentsResponse(status=err.status.code,
                                        header=routing.header(res=err.res))
        if isinstance(replica, str):
            assert routed.res is not None
            return await forward_unary(
                routing.forwarding, replica, FRAGMENTS_METHOD,
                proxied(request, routing.header(res=routed.res)),
                pb.FragmentsResponse.FromString, context,
                f"listing fragments of {request.journal}")
        problem = ""
        if request.next_page_token < 0:
            problem = "next_page_token: must not be negative"
        elif not 0 <= request.page_limit <= MAX_PAGE_LIMIT:
            problem = f"page_limit: must be in [0, {MAX_PAGE_LIMIT}]"
        elif request.end_mod_time and request.end_mod_time < request.begin_mod_time:
            problem = "end_mod_time: must not be before begin_mod_time"
        ttl = timedelta()
        if not problem and request.HasField("signature_ttl"):
            try:
                ttl = duration_from_pb(request.signature_ttl, "signature_ttl")
            except ValidationError as err:
                problem = str(err)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        limit = request.page_limit or DEFAULT_PAGE_LIMIT
        begin, end = request.begin_mod_time, request.end_mod_time
        items: list[pb.FragmentsResponse.Item] = []
        next_token = 0
        for frag in replica.fragments():
            if frag.begin < request.next_page_token:
                continue
            if (begin or end) and not frag.mod_time:
                if end:
                    continue  # not persisted: only listed without an end time
            elif (begin and frag.mod_time < begin) or (end and frag.mod_time >= end):
                continue
            if len(items) == limit:
                next_token = frag.begin
                break
            url = ""
            if ttl and frag.backing_store:
                try:
                    url = await replica.sign(frag, ttl)
                except StoreError as err:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            items.append(pb.FragmentsResponse.Item(spec=fragment_to_pb(frag), signed_url=url,
                                                   persist_error=replica.persist_error(frag)))
        return pb.FragmentsResponse(status=pb.OK, header=self.routing.header(), fragments=items,
                                    next_page_token=next_token)
