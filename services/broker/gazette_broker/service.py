"""The gRPC Journal service over this broker's replicas.

Refusals the protocol names (unknown journal, wrong offset, register mismatch, not
allowed, offset not yet available) are answered with their `Status` in the response;
malformed requests fail with INVALID_ARGUMENT and a message naming the field; a corrupt
stored fragment fails the read with DATA_LOSS. The broker keeps serving in every case.

In a cluster (a `Broker` with a resolver), any broker takes any request: an append goes
to the journal's primary and a read to one of its replicas (this broker's own, else one
in its zone), forwarded by this broker unless the request says `do_not_proxy` (then the
status names the problem and the header carries the route to retry at). A request's
header pins an etcd revision: the broker first catches up with it. Peers' Replicate
streams are verified against this broker's route of the journal (WRONG_ROUTE if not).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any, cast

import grpc

from gazette import names
from gazette.allocator import route_from_pb
from gazette.client.errors import AppendUncertain
from gazette.cluster import (
    CLOSED_DELETED,
    FORWARDED,
    PROXY_ANSWER_SECONDS,
    Channels,
    Resolution,
    Resolver,
    forward_stream,
    forward_unary,
    proxied,
)
from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment, JournalClosed
from gazette.fragment.fragment import fragment_to_pb
from gazette.fragment.store import StoreError
from gazette.keyspace import Entry, Etcd, Event, KeySpace, Layout, TxnConflict
from gazette.keyspace.specs import apply_changes
from gazette.labels import Selector, journal_labels
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
    APPEND_CONTENT_FIELD,
    AppendContent,
    ReadContent,
    ReplicateContent,
    content_field,
    decode_append_request,
    decode_replicate_request,
    encode_read_response,
)
from gazette.protocol.convert import duration_from_pb
from gazette.protocol.trees import SpecChange
from gazette_broker.errors import AppendError, AppendStalled
from gazette_broker.reads import ReadError
from gazette_broker.replica import Replica

log = logging.getLogger(__name__)

class AppendAborted(Exception):
    """The append stream ended without its commit message."""


#: How long the fragment URLs of metadata-only reads stay valid.
READ_SIGNATURE_TTL = timedelta(hours=1)
#: Fragments per ListFragments page unless the request asks for fewer.
DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT = 1000, 10_000
#: How long a request for a journal assigned here waits for its replica to open.
OPEN_WAIT_SECONDS = 5.0
APPEND_METHOD = "/gazette.broker.Journal/Append"
READ_METHOD = "/gazette.broker.Journal/Read"
FRAGMENTS_METHOD = "/gazette.broker.Journal/ListFragments"


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
            handlers["Replicate"] = handlers["Replicate"]._replace(
                request_deserializer=decode_replicate_request)
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
    `member` names this broker in response headers. With `resolver` (a broker in a
    cluster), requests are routed by the journal's assignments and forwarded over
    `channels`; `wait_serving` waits until this broker has opened given journals."""

    def __init__(self, replicas: Mapping[str, Replica], etcd: Etcd | None = None,
                 keyspace: KeySpace[Any] | None = None, layout: Layout | None = None,
                 member: MemberSpec | None = None,
                 unready: Mapping[str, str] | None = None,
                 resolver: Resolver[JournalSpec] | None = None, channels: Channels | None = None,
                 wait_serving: Any = None) -> None:
        self.replicas = replicas
        #: Journals with a spec that cannot be served yet, and why (UNAVAILABLE).
        self.unready: Mapping[str, str] = unready if unready is not None else {}
        self.etcd, self.keyspace, self.layout = etcd, keyspace, layout
        self.member = member
        self.resolver, self.channels = resolver, channels
        self._wait_serving = wait_serving
        self._route = pb.Route(primary=-1)
        self._process_id = pb.ProcessSpec.ID()
        if member is not None:
            self._process_id = pb.ProcessSpec.ID(zone=member.id.zone, suffix=member.id.suffix)
            self._route = pb.Route(members=[self._process_id], primary=0,
                                   endpoints=[member.endpoint])

    def _header(self, revision: int | None = None, res: Resolution[JournalSpec] | None = None
                ) -> pb.Header:
        if self.resolver is not None:
            header = self.resolver.header(res)
            if revision is not None:  # e.g. an Apply's own revision
                header.etcd.revision = revision
            return header
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
        return pb.ApplyResponse(status=pb.OK, header=self._header(revision),
                                warnings=self._warnings(changes))

    def _warnings(self, changes: list[SpecChange[JournalSpec]]) -> list[str]:
        """What in applied specs is likely not what their author meant."""
        assert self.keyspace is not None and self.layout is not None
        brokers = [e.value for e in self.keyspace.prefixed(self.layout.members)
                   if isinstance(e.value, MemberSpec) and e.value.item_limit > 0]
        out = []
        for change in changes:
            spec = change.spec
            if spec is None:
                continue
            if self.resolver is not None and spec.replication > len(brokers):
                out.append(f"{spec.name}: replication {spec.replication} is more than the "
                           f"{len(brokers)} broker(s) of the cluster: its appends are "
                           f"refused (INSUFFICIENT_JOURNAL_BROKERS) until there are "
                           f"{spec.replication}")
            if not spec.fragment.stores:
                out.append(f"{spec.name}: no fragment stores: its content is never "
                           "persisted, and is lost when its brokers stop (set "
                           "fragment.stores)")
            elif self.resolver is not None and brokers and not any(
                    b.serves_stores(spec.fragment.stores) for b in brokers):
                kinds = sorted({k for b in brokers for k in b.store_schemes})
                out.append(f"{spec.name}: no broker can serve its stores "
                           f"{', '.join(spec.fragment.stores)} (the brokers serve "
                           f"{', '.join(kinds) or 'none'}; file:// needs "
                           "--broker.file-root): it is not assigned until one can")
        return out

    def _listing(self, selector: Any) -> pb.ListResponse:
        assert self.keyspace is not None and self.layout is not None
        journals = []
        for entry in self._candidates(selector):
            spec = entry.value
            if isinstance(spec, JournalSpec) and selector.matches(
                    journal_labels(spec.name, spec.labels)):
                route: pb.Route | None = None
                if self.resolver is not None:
                    res = self.resolver.resolve(spec.name)
                    route = res.route.with_endpoints(res.endpoints).to_pb()
                else:
                    route = self._route if spec.name in self.replicas else None
                journals.append(pb.ListResponse.Journal(
                    spec=journal_spec_to_pb(spec), mod_revision=entry.kv.mod_revision,
                    create_revision=entry.kv.create_revision, route=route))
        return pb.ListResponse(status=pb.OK, header=self._header(self.keyspace.revision),
                               journals=journals)

    def _candidates(self, selector: Selector) -> list[Entry[Any]]:
        """The specs a selector may match: those it names (``name=``), or those under
        the prefixes it names (``prefix=``), else all; so that listing one journal does
        not cost a look at every one."""
        assert self.keyspace is not None and self.layout is not None
        items = self.layout.items
        names_ = selector.include.values("name")
        if names_ and all(names_):
            found = (self.keyspace.get(items + n) for n in sorted(set(names_)))
            return [e for e in found if e is not None]
        prefixes = selector.include.values("prefix")
        if prefixes and all(prefixes):
            seen: dict[str, Entry[Any]] = {}
            for prefix in prefixes:
                seen.update((e.kv.key, e) for e in self.keyspace.prefixed(items + prefix))
            return [seen[k] for k in sorted(seen)]
        return self.keyspace.prefixed(items)

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
        """The replica of `journal` here (None: no such journal); aborts on a bad name
        or a journal that cannot be served yet."""
        try:
            names.validate_journal_name(journal, "journal")
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        replica = self.replicas.get(journal)
        if replica is None and journal in self.unready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.unready[journal])
        return replica

    async def _resolve(self, journal: str, header: pb.Header | None, context: Any
                       ) -> tuple[Resolution[JournalSpec] | None, Replica | None]:
        """(Where `journal` is served, its replica here): the resolution is None for a
        lone broker (no cluster). A journal assigned here whose replica is still being
        opened is waited for (briefly)."""
        replica = await self._replica(journal, context)
        if self.resolver is None:
            return None, replica
        try:
            res = await self.resolver.resolve_at(journal, header)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if replica is None and self.resolver.me in res.route.members and \
                self._wait_serving is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OPEN_WAIT_SECONDS):
                    await self._wait_serving({journal})
            replica = await self._replica(journal, context)
            if replica is None and res.spec is not None and self.resolver.is_assigned(journal):
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"journal {journal} is assigned to this broker and still "
                                    "being opened (its fragment stores are listed first); "
                                    "retry")
        return res, replica

    def _reader_endpoint(self, res: Resolution[JournalSpec]) -> str:
        """A replica to forward a read to: one in this broker's zone if any."""
        assert self.resolver is not None
        return res.endpoint_near(self.resolver.me.zone)

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
        assert self.channels is not None
        FORWARDED.labels("Append").inc()
        call = self.channels.get(res.primary_endpoint).stream_unary(
            APPEND_METHOD,  # requests are sent as serialized here
            response_deserializer=pb.AppendResponse.FromString)()  # type: ignore[call-arg]
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

    async def Read(  # type: ignore[override]  # ReadContent: see add_journal_service
            self, request: pb.ReadRequest, context: Any,
    ) -> AsyncIterator[pb.ReadResponse | ReadContent | bytes]:
        res, replica = await self._resolve(
            request.journal, request.header if request.HasField("header") else None, context)
        if replica is None:
            if res is None or res.spec is None:
                yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND, header=self._header(res=res))
                return
            endpoint = self._reader_endpoint(res)
            if request.do_not_proxy or not endpoint:
                yield pb.ReadResponse(status=pb.NOT_JOURNAL_BROKER, header=self._header(res=res))
                return
            # Generators are closed here, when the read ends or is cancelled, not later
            # by the garbage collector.
            async with contextlib.aclosing(forward_stream(
                    self.channels, endpoint, READ_METHOD,  # type: ignore[arg-type]
                    proxied(request, self._header(res=res)), context,
                    f"reading {request.journal}")) as forwarded:
                async for raw in forwarded:
                    yield raw
            return
        try:
            if request.metadata_only:
                yield await self._read_metadata(replica, request)
                return
            first = True
            async with contextlib.aclosing(replica.read(
                    request.offset, block=request.block,
                    end_offset=request.end_offset)) as chunks:
                async for chunk in chunks:
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
        return pb.ReadResponse(status=pb.OK, header=self._header(), offset=offset,
                               write_head=replica.write_head,
                               fragment=fragment_to_pb(frag), fragment_url=url)

    async def Replicate(self, request_iterator: AsyncIterator[ReplicateContent],  # type: ignore[override]
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

    async def ListFragments(self, request: pb.FragmentsRequest, context: Any
                            ) -> pb.FragmentsResponse:
        res, replica = await self._resolve(
            request.journal, request.header if request.HasField("header") else None, context)
        if replica is None:
            if res is None or res.spec is None:
                return pb.FragmentsResponse(status=pb.JOURNAL_NOT_FOUND,
                                            header=self._header(res=res))
            endpoint = self._reader_endpoint(res)
            if request.do_not_proxy or not endpoint:
                return pb.FragmentsResponse(status=pb.NOT_JOURNAL_BROKER,
                                            header=self._header(res=res))
            return await forward_unary(
                self.channels, endpoint, FRAGMENTS_METHOD,  # type: ignore[arg-type]
                proxied(request, self._header(res=res)), pb.FragmentsResponse.FromString,
                context, f"listing fragments of {request.journal}")
        assert replica is not None  # abort() raised otherwise
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
        return pb.FragmentsResponse(status=pb.OK, header=self._header(), fragments=items,
                                    next_page_token=next_token)


async def _one(content: bytes | memoryview) -> AsyncIterator[bytes | memoryview]:
    yield content
