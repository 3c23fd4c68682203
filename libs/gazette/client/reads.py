"""Reads of a `JournalClient`: from the broker, or straight from a fragment's store
(``direct``), resuming after a failure at the next offset not yet yielded, with the next
fragment fetched while one is served; and the write head."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import grpc

from gazette import names
from gazette.client.connection import Connection, _check_offset, _ended_early
from gazette.client.errors import BrokerError
from gazette.client.fetch import fetch_fragment
from gazette.client.metrics import READ_BYTES
from gazette.client.results import ReadChunk
from gazette.errors import ValidationError
from gazette.fragment import Fragment, fragment_from_pb
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol.content import ReadContent, decode_read_response
from gazette.protocol.status import Status

log = logging.getLogger(__name__)


class _Fetched:
    """A fragment's fetch (`rest` of its chunks), maybe primed: its first chunk taken,
    which means the fragment was fetched and verified."""

    def __init__(self, chunks: AsyncGenerator[ReadChunk, None]) -> None:
        self.rest = chunks
        self._first: ReadChunk | None = None

    async def prime(self) -> None:
        self._first = await anext(self.rest, None)

    async def chunks(self) -> AsyncGenerator[ReadChunk, None]:
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        async for chunk in self.rest:
            yield chunk


@dataclass
class _Ahead:
    """The fetch of the fragment at `offset`, running while the one before is served."""

    offset: int
    task: asyncio.Task[tuple[pb.ReadResponse | None, _Fetched | None]]

    async def drop(self) -> None:
        """Cancel it if it still runs; close its fetch if it has one."""
        self.task.cancel()
        await asyncio.wait({self.task})
        if not self.task.cancelled() and self.task.exception() is None:
            _, fetched = self.task.result()
            if fetched is not None:
                await fetched.rest.aclose()


class Reads:
    """`read` and `write_head` over a `Connection`."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._stub = broker_pb2_grpc.JournalStub(connection.channel)
        self._read_rpc: grpc.aio.UnaryStreamMultiCallable[
            pb.ReadRequest, ReadContent] = connection.channel.unary_stream(
                "/gazette.broker.Journal/Read",
                request_serializer=pb.ReadRequest.SerializeToString,
                response_deserializer=decode_read_response)

    async def read(self, journal: str, offset: int = 0, *, block: bool = False,
                   end_offset: int = 0, direct: bool = False
                   ) -> AsyncGenerator[ReadChunk, None]:
        """The content of `journal` from `offset` (-1: the write head when the read
        starts), as chunks of up to about 1 MiB: up to the write head (without `block`),
        for ever, following appends (with `block`), or up to `end_offset` (if non-zero).
        Content missing from the journal (removed by retention) is skipped: a chunk's
        offset says where it is. With `direct`, fragments the broker says are persisted
        are fetched from their stores by URL (sparing the broker the bytes) and verified
        before they are yielded. Close it early with `contextlib.aclosing`."""
        names.validate_journal_name(journal, "journal")
        pos = _check_offset(offset, "offset", -1)
        end = _check_offset(end_offset, "end_offset", 0)
        if pos == -1:
            pos = await self.write_head(journal)
        backoff = self._connection.backoff("read", journal)
        ahead: _Ahead | None = None  # direct reads: the next fragment, fetched meanwhile
        try:
            while not end or pos < end:
                try:
                    bound = end
                    if direct:
                        if ahead is not None and ahead.offset == pos:
                            taken, ahead = ahead, None
                            meta, fetched = await taken.task
                        else:
                            if ahead is not None:  # resumed elsewhere: not needed
                                await ahead.drop()
                                ahead = None
                            meta, fetched = await self._metadata(journal, pos, block), None
                        if meta is None:
                            return  # at the write head
                        frag = fragment_from_pb(meta.fragment)
                        pos = max(pos, meta.offset)
                        if meta.fragment_url:
                            stop = min(frag.end, end) if end else frag.end
                            if not end or stop < end:
                                ahead = _Ahead(stop, asyncio.create_task(
                                    self._fetch_ahead(journal, stop, block, end)))
                            fetched = fetched or _Fetched(self._fetch(meta, frag, pos, stop))
                            async with contextlib.aclosing(fetched.rest), \
                                    contextlib.aclosing(fetched.chunks()) as chunks:
                                async for chunk in chunks:
                                    pos = chunk.end
                                    yield chunk
                            backoff.reset()
                            continue  # at `stop` (or, were the fetch cut short, before)
                        if frag.end < meta.write_head:  # closed: then look again
                            bound = min(frag.end, end) if end else frag.end
                    start = pos
                    async with contextlib.aclosing(self._read_through(
                            journal, pos, block, bound, end)) as through:
                        async for chunk in through:
                            pos = chunk.end
                            backoff.reset()
                            yield chunk
                    if bound != end and pos > start:
                        continue  # read a closed fragment through the broker: look again
                    if block and not (end and pos >= end):
                        raise _ended_early(journal)  # streams of blocking reads don't end
                    return
                except grpc.aio.AioRpcError as err:
                    await backoff.wait(err)
                except BrokerError as err:
                    # The journal's route is changing (a broker failing over or joining):
                    # nothing was skipped; read on from `pos` in a moment.
                    if not err.route_changing:
                        raise
                    if ahead is not None:
                        await ahead.drop()
                        ahead = None
                    await backoff.wait_status(err.status)
        finally:
            if ahead is not None:
                await ahead.drop()

    async def _read_through(self, journal: str, pos: int, block: bool, bound: int,
                            end: int) -> AsyncGenerator[ReadChunk, None]:
        """Chunks read through the broker from `pos` (up to `bound`; cut at `end`)."""
        async with contextlib.aclosing(self._read_stream(journal, pos, block, bound)) as parts:
            async for part in parts:
                resp, content = part.meta, part.content
                if resp.offset < pos:  # never yield a byte twice
                    content = content[pos - resp.offset:]
                at = max(resp.offset, pos)
                if end and at + len(content) > end:
                    content = content[:end - at]
                if not content:
                    continue
                READ_BYTES.labels("broker").inc(len(content))
                pos = at + len(content)
                yield ReadChunk(at, content, fragment_from_pb(resp.fragment),
                                resp.write_head)

    async def _fetch_ahead(self, journal: str, pos: int, block: bool, end: int
                           ) -> tuple[pb.ReadResponse | None, _Fetched | None]:
        """The metadata at `pos` and, if only a store holds that fragment, its fetch
        started and verified (its first chunk ready): done while the fragment before
        it is served, so that two fragments verify on two cores."""
        meta = await self._metadata(journal, pos, block)
        if meta is None or not meta.fragment_url:
            return meta, None
        frag = fragment_from_pb(meta.fragment)
        start = max(pos, meta.offset)
        fetched = _Fetched(self._fetch(meta, frag, start, min(frag.end, end) if end
                                       else frag.end))
        try:
            await fetched.prime()
        except BaseException:
            await fetched.rest.aclose()
            raise
        return meta, fetched

    async def _read_stream(self, journal: str, offset: int, block: bool, end_offset: int
                           ) -> AsyncGenerator[ReadContent, None]:
        """Responses with content; ends at the write head (non-blocking reads)."""
        call = self._read_rpc(pb.ReadRequest(journal=journal, offset=offset, block=block,
                                             end_offset=end_offset))
        try:
            async for part in call:
                status = part.meta.status
                if status != pb.OK:
                    if status == pb.OFFSET_NOT_YET_AVAILABLE and not block:
                        return
                    raise BrokerError(Status.of(status), journal,
                                      f"reading from offset {offset}")
                if part.content:
                    yield part
        finally:
            call.cancel()

    async def _metadata(self, journal: str, offset: int, block: bool
                        ) -> pb.ReadResponse | None:
        """The broker's one answer to a metadata-only read at `offset`: where the read
        starts, its fragment, and a URL if that fragment is only in a store. None at the
        write head (non-blocking)."""
        call = self._stub.Read(pb.ReadRequest(journal=journal, offset=offset, block=block,
                                              metadata_only=True),
                               timeout=None if block else self._connection.timeout)
        try:
            async for resp in call:
                if resp.status == pb.OK:
                    return resp
                if resp.status == pb.OFFSET_NOT_YET_AVAILABLE and not block:
                    return None
                raise BrokerError(Status.of(resp.status), journal,
                                  f"reading from offset {offset}")
        finally:
            call.cancel()
        raise _ended_early(journal)

    async def _fetch(self, meta: pb.ReadResponse, frag: Fragment, pos: int, stop: int
                     ) -> AsyncGenerator[ReadChunk, None]:
        """[pos, stop) of a persisted fragment, from its store; read through the broker
        instead if the store cannot be reached from here (a corrupt file raises)."""
        yielded = False
        try:
            async with contextlib.aclosing(fetch_fragment(meta.fragment_url, frag,
                                                          pos)) as contents:
                async for content in contents:
                    if pos + len(content) > stop:
                        content = content[:stop - pos]
                    if content:
                        READ_BYTES.labels("store").inc(len(content))
                        yielded = True
                        yield ReadChunk(pos, content, frag, meta.write_head)
                        pos += len(content)
                    if pos >= stop:
                        return
            return
        except (OSError, ValidationError) as exc:  # FetchError (HTTP) is an OSError
            if yielded:
                raise  # cannot fall back cleanly in the middle
            log.warning("cannot fetch %s from its store (%s); reading it through the "
                        "broker", frag.path, exc)
        async with contextlib.aclosing(self._read_through(frag.journal, pos, False, stop,
                                                          stop)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def write_head(self, journal: str) -> int:
        """The journal's write head: the offset its next append will start at."""
        names.validate_journal_name(journal, "journal")
        backoff = self._connection.backoff("write_head", journal)
        while True:
            call = self._stub.Read(pb.ReadRequest(journal=journal, offset=-1,
                                                  metadata_only=True),
                                   timeout=self._connection.timeout)
            try:
                async for resp in call:
                    if resp.status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                        return int(resp.write_head)
                    status = Status.of(resp.status)
                    if not status.route_changing:
                        raise BrokerError(status, journal, "asking for the write head")
                    break
                else:
                    raise _ended_early(journal)
            except grpc.aio.AioRpcError as err:
                await backoff.wait(err)
                continue
            finally:
                call.cancel()
            await backoff.wait_status(status)  # the route is changing: ask again
