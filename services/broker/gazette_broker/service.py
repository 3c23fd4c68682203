"""The gRPC Journal service over this broker's replicas.

Refusals the protocol names (unknown journal, wrong offset, register mismatch, not
allowed, offset not yet available) are answered with their `Status` in the response;
malformed requests fail with INVALID_ARGUMENT and a message naming the field; a corrupt
stored fragment fails the read with DATA_LOSS. The broker keeps serving in every case.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any, cast

import grpc

from gazette import names
from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment
from gazette.fragment.fragment import fragment_to_pb
from gazette.fragment.store import StoreError
from gazette.keyspace import Etcd, Event, KeySpace, Layout, TxnConflict
from gazette.keyspace.specs import apply_changes
from gazette.labels import journal_labels
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import (
    JournalSpec,
    MemberSpec,
    journal_spec_from_pb,
    journal_spec_to_pb,
    labels_from_pb,
    labels_to_pb,
    selector_from_pb,
)
from gazette.protocol.content import (
    AppendContent,
    ReadContent,
    decode_append_request,
    encode_read_response,
)
from gazette.protocol.convert import duration_from_pb
from gazette.protocol.trees import SpecChange
from gazette_broker.replica import AppendError, ReadError, Replica


class AppendAborted(Exception):
    """The append stream ended without its commit message."""


#: How long the fragment URLs of metadata-only reads stay valid.
READ_SIGNATURE_TTL = timedelta(hours=1)
#: Fragments per ListFragments page unless the request asks for fewer.
DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT = 1000, 10_000


def add_journal_service(service: JournalService, server: grpc.aio.Server) -> None:
    """Serve `service` on `server` as the generated registration does, except that the
    content of appends and reads is copied once (`gazette.protocol.content`): Append
    and AppendWhole requests arrive as `AppendContent`, Read responses may be
    `ReadContent`."""

    class Registrar:
        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            pass  # the same handlers arrive below, by name

        def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]
                                           ) -> None:
            handlers["Read"] = handlers["Read"]._replace(
                response_serializer=encode_read_response)
            for method in ("Append", "AppendWhole"):
                handlers[method] = handlers[method]._replace(
                    request_deserializer=decode_append_request)
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(name, handlers),))
            server.add_registered_method_handlers(  # type: ignore[attr-defined]
                name, handlers)  # (grpc-stubs predate it)

    broker_pb2_grpc.add_JournalServicer_to_server(service, cast(Any, Registrar()))


class JournalService(broker_pb2_grpc.JournalServicer):
    """Serves `replicas`; with `etcd`, `keyspace` and `layout`, also Apply and List.
    `member` names this broker in response headers and routes (a single broker serves
    every journal until the allocator assigns them)."""

    def __init__(self, replicas: Mapping[str, Replica], etcd: Etcd | None = None,
                 keyspace: KeySpace[Any] | None = None, layout: Layout | None = None,
                 member: MemberSpec | None = None,
                 unready: Mapping[str, str] | None = None) -> None:
        self.replicas = replicas
        #: Journals with a spec that cannot be served yet, and why (UNAVAILABLE).
        self.unready: Mapping[str, str] = unready if unready is not None else {}
        self.etcd, self.keyspace, self.layout = etcd, keyspace, layout
        self.member = member
        self._route = pb.Route(primary=-1)
        self._process_id = pb.ProcessSpec.ID()
        if member is not None:
            self._process_id = pb.ProcessSpec.ID(zone=member.id.zone, suffix=member.id.suffix)
            self._route = pb.Route(members=[self._process_id], primary=0,
                                   endpoints=[member.endpoint])

    def _header(self, revision: int | None = None) -> pb.Header:
        if revision is None:
            revision = self.keyspace.revision if self.keyspace is not None else 0
        return pb.Header(process_id=self._process_id, route=self._route,
                         etcd=pb.Header.Etcd(revision=revision))

    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:
        etcd, layout = self.etcd, self.layout
        if etcd is None or layout is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this broker has no etcd")
        assert etcd is not None and layout is not None  # abort() raised otherwise
        changes: list[SpecChange[JournalSpec]] = []
        try:
            for i, change in enumerate(request.changes):
                if change.WhichOneof("change") == "upsert":
                    try:
                        spec = journal_spec_from_pb(change.upsert)
                    except ValidationError as err:
                        raise err.within(f"changes[{i}].upsert") from None
                    changes.append(SpecChange(spec.name, change.expect_mod_revision, spec))
                elif change.WhichOneof("change") == "delete":
                    names.validate_journal_name(change.delete, f"changes[{i}].delete")
                    changes.append(SpecChange(change.delete, change.expect_mod_revision, None))
                else:
                    raise ValidationError(f"changes[{i}]", "neither upsert nor delete")
            revision = await apply_changes(etcd, layout, changes)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except TxnConflict as err:
            return pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED,
                                    header=self._header(err.revision))
        return pb.ApplyResponse(status=pb.OK, header=self._header(revision))

    def _listing(self, selector: Any) -> pb.ListResponse:
        assert self.keyspace is not None and self.layout is not None
        journals = []
        for entry in self.keyspace.prefixed(self.layout.items):
            spec = entry.value
            if isinstance(spec, JournalSpec) and selector.matches(
                    journal_labels(spec.name, spec.labels)):
                journals.append(pb.ListResponse.Journal(
                    spec=journal_spec_to_pb(spec), mod_revision=entry.kv.mod_revision,
                    create_revision=entry.kv.create_revision,
                    route=self._route if spec.name in self.replicas else None))
        return pb.ListResponse(status=pb.OK, header=self._header(self.keyspace.revision),
                               journals=journals)

    async def List(self, request: pb.ListRequest, context: Any
                   ) -> AsyncIterator[pb.ListResponse]:
        keyspace, layout = self.keyspace, self.layout
        if keyspace is None or layout is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this broker has no etcd")
        assert keyspace is not None and layout is not None  # abort() raised otherwise
        try:
            selector = selector_from_pb(request.selector)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if not request.watch:
            yield self._listing(selector)
            return
        resume = request.watch_resume_revision
        if resume < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"watch_resume_revision: must be >= 0, got {resume}")
        changed = asyncio.Event()  # coalesces bursts of changes into one listing

        def on_change(revision: int, events: list[Event]) -> None:
            if any(ev.kv.key.startswith(layout.items) for ev in events):
                changed.set()

        stop = keyspace.observe(on_change)
        try:
            # A client resuming at a revision it has seen gets nothing until a change.
            if not resume or keyspace.revision > resume:
                yield self._listing(selector)
            while True:
                await changed.wait()
                changed.clear()
                yield self._listing(selector)
        finally:
            stop()

    async def _replica(self, journal: str, context: Any) -> Replica | None:
        try:
            names.validate_journal_name(journal, "journal")
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        replica = self.replicas.get(journal)
        if replica is None and journal in self.unready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.unready[journal])
        return replica

    async def Append(  # type: ignore[override]  # AppendContent: see add_journal_service
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

    async def AppendWhole(  # type: ignore[override]  # AppendContent: as Append
            self, request: AppendContent, context: Any) -> pb.AppendResponse:
        if not request.content:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "content: an AppendWhole request carries the content")
        return await self._append(request.meta, _one(request.content), context)

    async def _append(self, meta: pb.AppendRequest, content: AsyncIterator[bytes | memoryview],
                      context: Any) -> pb.AppendResponse:
        """The append of `content` under the metadata of `meta` (journal, expected
        offset, registers)."""
        replica = await self._replica(meta.journal, context)
        if replica is None:
            return pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND)
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
            return pb.AppendResponse(status=pb.Status.Value(err.status))
        except AppendAborted as err:
            await context.abort(grpc.StatusCode.CANCELLED, f"{err}: nothing was appended")
        return pb.AppendResponse(status=pb.OK, commit=fragment_to_pb(result.commit),
                                 registers=labels_to_pb(result.registers))

    async def Read(  # type: ignore[override]  # ReadContent: see add_journal_service
            self, request: pb.ReadRequest, context: Any,
    ) -> AsyncIterator[pb.ReadResponse | ReadContent]:
        replica = await self._replica(request.journal, context)
        if replica is None:
            yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND, header=self._header())
            return
        try:
            if request.metadata_only:
                yield await self._read_metadata(replica, request)
                return
            first = True
            async for chunk in replica.read(request.offset, block=request.block,
                                            end_offset=request.end_offset):
                yield ReadContent(pb.ReadResponse(
                    status=pb.OK, header=self._header() if first else None,
                    offset=chunk.offset, write_head=chunk.write_head,
                    fragment=fragment_to_pb(chunk.fragment)), chunk.content)
                first = False
        except ReadError as err:
            if err.status in pb.Status.keys():  # noqa: SIM118 - an enum wrapper, not a dict
                yield pb.ReadResponse(status=pb.Status.Value(err.status),
                                      write_head=replica.write_head)
            else:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
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
        return pb.ReadResponse(status=pb.OK, header=self._header(), offset=offset,
                               write_head=replica.write_head,
                               fragment=fragment_to_pb(frag), fragment_url=url)

    async def Replicate(self, request_iterator: Any, context: Any
                        ) -> AsyncIterator[pb.ReplicateResponse]:
        """Replication between brokers arrives with the broker cluster (allocator,
        peers); a single broker has no peers."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "replication is not served by this broker version")
        yield pb.ReplicateResponse()  # pragma: no cover - makes this a stream handler

    async def ListFragments(self, request: pb.FragmentsRequest, context: Any
                            ) -> pb.FragmentsResponse:
        replica = await self._replica(request.journal, context)
        if replica is None:
            return pb.FragmentsResponse(status=pb.JOURNAL_NOT_FOUND, header=self._header())
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
            items.append(pb.FragmentsResponse.Item(spec=fragment_to_pb(frag), signed_url=url))
        return pb.FragmentsResponse(status=pb.OK, header=self._header(), fragments=items,
                                    next_page_token=next_token)


async def _one(content: bytes | memoryview) -> AsyncIterator[bytes | memoryview]:
    yield content
