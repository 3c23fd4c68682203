"""The gRPC Journal service over this broker's replicas (Append and Read so far).

Refusals the protocol names (unknown journal, wrong offset, register mismatch, not
allowed, offset not yet available) are answered with their `Status` in the response;
malformed requests fail with INVALID_ARGUMENT and a message naming the field; a corrupt
stored fragment fails the read with DATA_LOSS. The broker keeps serving in every case.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from gazette import names
from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment
from gazette.fragment.fragment import fragment_to_pb
from gazette.keyspace import Etcd, Event, KeySpace, Layout, TxnConflict
from gazette.keyspace.specs import apply_changes
from gazette.labels import journal_labels
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import (
    JournalSpec,
    journal_spec_from_pb,
    journal_spec_to_pb,
    labels_from_pb,
    labels_to_pb,
    selector_from_pb,
)
from gazette.protocol.trees import SpecChange
from gazette_broker.replica import AppendError, ReadError, Replica


class AppendAborted(Exception):
    """The append stream ended without its commit message."""


class JournalService(broker_pb2_grpc.JournalServicer):
    def __init__(self, replicas: Mapping[str, Replica], etcd: Etcd | None = None,
                 keyspace: KeySpace[Any] | None = None, layout: Layout | None = None) -> None:
        self.replicas = replicas
        self.etcd, self.keyspace, self.layout = etcd, keyspace, layout

    def _header(self, revision: int) -> pb.Header:
        return pb.Header(etcd=pb.Header.Etcd(revision=revision))

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
                    create_revision=entry.kv.create_revision))
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
        yield self._listing(selector)
        if not request.watch:
            return
        changed = asyncio.Event()  # coalesces bursts of changes into one listing

        def on_change(revision: int, events: list[Event]) -> None:
            if any(ev.kv.key.startswith(layout.items) for ev in events):
                changed.set()

        stop = keyspace.observe(on_change)
        try:
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
        return self.replicas.get(journal)

    async def Append(self, request_iterator: Any, context: Any) -> pb.AppendResponse:
        requests = request_iterator.__aiter__()
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty append stream")
        if first.content:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "content: the first message carries metadata only")
        replica = await self._replica(first.journal, context)
        if replica is None:
            return pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND)
        try:
            check = (selector_from_pb(first.check_registers, "check_registers")
                     if first.HasField("check_registers") else None)
            union = labels_from_pb(first.union_registers, "union_registers")
            subtract = labels_from_pb(first.subtract_registers, "subtract_registers")
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

        async def content() -> AsyncIterator[bytes]:
            async for req in requests:
                if not req.content:
                    return  # the commit message
                yield req.content
            raise AppendAborted("the append stream ended without its commit message")

        try:
            result = await replica.append(
                content(), offset=first.offset or None, check_registers=check,
                union_registers=union or None, subtract_registers=subtract or None)
        except AppendError as err:
            return pb.AppendResponse(status=pb.Status.Value(err.status))
        except AppendAborted as err:
            await context.abort(grpc.StatusCode.CANCELLED, f"{err}: nothing was appended")
        return pb.AppendResponse(status=pb.OK, commit=fragment_to_pb(result.commit),
                                 registers=labels_to_pb(result.registers))

    async def Read(self, request: pb.ReadRequest, context: Any
                   ) -> AsyncIterator[pb.ReadResponse]:
        replica = await self._replica(request.journal, context)
        if replica is None:
            yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND)
            return
        try:
            async for chunk in replica.read(request.offset, block=request.block,
                                            end_offset=request.end_offset):
                yield pb.ReadResponse(
                    status=pb.OK, offset=chunk.offset, write_head=chunk.write_head,
                    fragment=fragment_to_pb(chunk.fragment),
                    content=b"" if request.metadata_only else chunk.content)
        except ReadError as err:
            if err.status in pb.Status.keys():  # noqa: SIM118 - an enum wrapper, not a dict
                yield pb.ReadResponse(status=pb.Status.Value(err.status),
                                      write_head=replica.write_head)
            else:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except CorruptFragment as err:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(err))
