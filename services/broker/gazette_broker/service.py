"""The gRPC Journal service over this broker's replicas (Append and Read so far).

Refusals the protocol names (unknown journal, wrong offset, register mismatch, not
allowed, offset not yet available) are answered with their `Status` in the response;
malformed requests fail with INVALID_ARGUMENT and a message naming the field; a corrupt
stored fragment fails the read with DATA_LOSS. The broker keeps serving in every case.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from gazette import names
from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment
from gazette.fragment.fragment import fragment_to_pb
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import labels_from_pb, labels_to_pb, selector_from_pb
from gazette_broker.replica import AppendError, ReadError, Replica


class AppendAborted(Exception):
    """The append stream ended without its commit message."""


class JournalService(broker_pb2_grpc.JournalServicer):
    def __init__(self, replicas: Mapping[str, Replica]) -> None:
        self.replicas = replicas

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
