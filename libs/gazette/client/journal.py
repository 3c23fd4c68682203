"""`JournalClient`: appends, reads, listings, spec changes and fragment listings against
a broker, over one gRPC channel.

Retries. Transport failures (a broker restarting, a cut connection, a timeout) are
retried with jittered backoff (`RetryPolicy`), but never so that an acknowledged append
could land twice:

- an append that failed before its commit message was handed to gRPC is sent again:
  nothing of it can have committed (the broker rolls back an append whose stream ends
  without its commit);
- one whose commit was sent but whose answer was lost is *uncertain*. With an expected
  `offset`, the client resolves it: it sends it again at the same offset. The broker
  takes one append at a time and checks the offset under that lock, so at most one of
  the attempts can commit; WRONG_APPEND_OFFSET means something was written there first,
  and the client reads those bytes back and compares their SHA-1 with its own: equal
  means the first attempt committed (success), anything else means another writer won
  (`BrokerError`, nothing of ours was written). Without an offset it raises
  `AppendUncertain`.

A reader resumes after a failure at the next offset it has not yielded, so it never
yields a byte twice nor skips one.

Routing. Any broker of a cluster takes any request and forwards it to the broker that
serves the journal. With ``route_appends=True`` the client instead learns each journal's
primary from the route in response headers and sends later appends of that journal
straight to it (one hop less), falling back to its own address when the primary cannot
be reached or the route changes. Brokers' advertised endpoints must then be reachable
from the client.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import logging
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc

from gazette import names
from gazette.client.errors import AppendUncertain, ApplyConflict, BrokerError, Unavailable
from gazette.client.fetch import fetch_fragment
from gazette.client.metrics import APPEND_BYTES, APPENDS, READ_BYTES
from gazette.client.results import AppendResult, ReadChunk
from gazette.client.retry import (
    RETRYABLE,
    RETRYABLE_STATUSES,
    Backoff,
    RetryPolicy,
    rpc_error,
)
from gazette.client.wire import (
    CHANNEL_OPTIONS,
    Content,
    Packer,
    WholeAppend,
    encode_append,
    pack,
    parse_address,
)
from gazette.errors import ValidationError, short_repr
from gazette.fragment import Fragment, fragment_from_pb
from gazette.labels import LabelSet, Selector
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import (
    JournalSpec,
    Route,
    journal_spec_from_pb,
    journal_spec_to_pb,
    labels_from_pb,
    labels_to_pb,
    route_from_pb,
    selector_to_pb,
)
from gazette.protocol.content import ReadContent, decode_read_response
from gazette.protocol.convert import duration_to_pb
from gazette.protocol.trees import SpecChange

log = logging.getLogger(__name__)

#: What `append` takes: bytes-like content, or chunks of it (a sync iterable is
#: collected first so the append can be sent again; an async one is streamed once).
AppendContent = bytes | bytearray | memoryview | Iterable[bytes] | AsyncIterable[bytes]

_COMMIT = pb.AppendRequest()  # an empty content message commits the append


@dataclass(frozen=True)
class Applied:
    """An applied change of specs: etcd's `revision` after it, and `warnings` about
    specs that are likely not what their author meant (one sentence each)."""

    revision: int
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ListedJournal:
    """A journal of a listing: its spec, the etcd revisions it was created and last
    modified at (pass `mod_revision` to `apply` to change it), and its route (empty
    while no broker serves it)."""

    spec: JournalSpec
    mod_revision: int
    create_revision: int
    route: Route


@dataclass(frozen=True)
class Listing:
    """The journals matching a selector (sorted by name) as of etcd `revision`."""

    revision: int
    journals: list[ListedJournal]


@dataclass(frozen=True)
class FragmentInfo:
    """A fragment of a journal and, if requested and it is persisted, a signed URL to
    fetch it from its store (`fetch_fragment`); for a closed fragment not persisted
    yet, why its last upload failed (`persist_error`, "" if it did not)."""

    fragment: Fragment
    signed_url: str
    persist_error: str = ""


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


class _AttemptFailed(Exception):
    """One Append attempt failed in transport; `committing`: its commit had been sent."""

    def __init__(self, err: grpc.aio.AioRpcError, committing: bool) -> None:
        super().__init__(str(err))
        self.err, self.committing = err, committing


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


class JournalClient:
    """A client of one broker (``async with JournalClient("localhost:8080") as c``).

    `address` is ``host:port``, ``http://host:port`` or ``grpc://host:port``, or a gRPC
    target such as ``unix:/path``. `retry` governs retries of transport failures;
    `timeout` bounds each unary request (listings, applies, metadata reads; not appends
    and reads, which may stream for long); `channel_options` are added to (and override)
    the client's gRPC channel options. Safe to share between tasks of one event loop.
    """

    def __init__(self, address: str, *, retry: RetryPolicy | None = None,
                 channel_options: Sequence[tuple[str, Any]] = (),
                 timeout: float = 30.0, route_appends: bool = False) -> None:
        self.address = parse_address(address)
        self.route_appends = route_appends
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ValidationError("retry", f"expected a RetryPolicy, got {type(retry).__name__}")
        self.retry = retry or RetryPolicy()
        if not timeout > 0:
            raise ValidationError("timeout", f"must be > 0 seconds, got {timeout!r}")
        self.timeout = timeout
        options = dict(CHANNEL_OPTIONS)
        options.update(dict(channel_options))
        self._options = list(options.items())
        self._channel = grpc.aio.insecure_channel(self.address, options=self._options)
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
        return f"JournalClient({self.address!r})"

    async def close(self) -> None:
        """Close the channel: RPCs still running end with `Unavailable` (code CLOSED),
        and so do calls made afterwards."""
        self._closed = True
        await asyncio.gather(self._channel.close(None),
                             *(a.channel.close(None) for a in self._appenders.values()))

    async def __aenter__(self) -> JournalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _backoff(self, op: str, journal: str = "") -> Backoff:
        if self._closed:
            raise Unavailable(op, self.address, "CLOSED", "the client was closed", journal)
        return Backoff(self.retry, op, self.address, journal, lambda: self._closed)

    # -- appends -------------------------------------------------------------------

    async def append(self, journal: str, content: AppendContent, *,
                     offset: int | None = None, check_registers: Selector | None = None,
                     union_registers: LabelSet | None = None,
                     subtract_registers: LabelSet | None = None) -> AppendResult:
        """Append `content` to `journal` atomically (never interleaved with another
        append). With `offset`, only if the journal's write head is there (and then a
        lost answer is resolved, see the module docs; 0 checks nothing: the protocol
        cannot express "expect an empty journal"). With `check_registers`, only if the
        journal's registers match; `union_registers`/`subtract_registers` change them
        when it commits.

        Raises `BrokerError` when refused (nothing written), `AppendUncertain` when the
        outcome is unknown, `Unavailable` when the broker cannot be reached (nothing
        written). Buffers passed in must not change until this returns."""
        names.validate_journal_name(journal, "journal")
        backoff = self._backoff("append", journal)
        expect = 0 if offset is None else _check_offset(offset, "offset", 0)
        first = pb.AppendRequest(journal=journal, offset=expect)
        if check_registers is not None:
            if not isinstance(check_registers, Selector):
                raise ValidationError("check_registers", "expected a Selector")
            first.check_registers.CopyFrom(selector_to_pb(check_registers))
        if union_registers:
            first.union_registers.CopyFrom(labels_to_pb(union_registers))
        if subtract_registers:
            first.subtract_registers.CopyFrom(labels_to_pb(subtract_registers))
        if isinstance(content, AsyncIterable):
            return await self._append_streamed(journal, first, content)
        _not_str(content)
        if isinstance(content, bytes | bytearray | memoryview):
            messages, size = pack([content])
        else:
            messages, size = pack(content)

        uncertain = False
        while True:
            appender = self._appender(journal)
            try:
                resp = await self._attempt(first, messages, appender)
            except _AttemptFailed as failed:
                if appender is not self._broker:  # back to our own address
                    self._primaries.pop(journal, None)
                # Only a transport failure leaves a sent commit in doubt: other codes are
                # the broker's own refusals, made before anything was written.
                uncertain = uncertain or (failed.committing and failed.err.code() in RETRYABLE)
                if uncertain and not expect:
                    raise AppendUncertain(
                        journal, f"the answer to its commit was lost "
                        f"({failed.err.code().name}: {failed.err.details()})") from failed.err
                try:
                    await backoff.wait(failed.err)
                except (Unavailable, BrokerError) as exc:
                    if uncertain:
                        raise AppendUncertain(journal, f"its commit was sent but resolving "
                                              f"it failed: {exc}", expect) from exc
                    raise
                continue
            self._learn(journal, resp.header)
            if pb.Status.Name(resp.status) in RETRYABLE_STATUSES:
                await backoff.wait_status(pb.Status.Name(resp.status))
                continue
            if resp.status == pb.WRONG_APPEND_OFFSET and uncertain:
                try:
                    return await self._resolve(journal, expect, messages, size)
                except Unavailable as exc:
                    raise AppendUncertain(journal, f"its commit was sent but reading it "
                                          f"back failed: {exc}", expect) from exc
            return self._result(journal, resp)

    def _appender(self, journal: str) -> _Appender:
        """Where an append of `journal` goes: its primary, if known and routing."""
        target = self._primaries.get(journal)
        if target is None:
            return self._broker
        appender = self._appenders.get(target)
        if appender is None:
            channel = grpc.aio.insecure_channel(target, options=self._options)
            appender = self._appenders[target] = _Appender(channel)
        return appender

    def _learn(self, journal: str, header: pb.Header) -> None:
        """Remember the primary a response's route names (with `route_appends`)."""
        route = header.route
        if not self.route_appends or not 0 <= route.primary < len(route.endpoints):
            return
        try:
            target = parse_address(route.endpoints[route.primary])
        except ValidationError:
            return
        if target == self.address:
            self._primaries.pop(journal, None)
        else:
            self._primaries[journal] = target

    async def _attempt(self, first: pb.AppendRequest, messages: Sequence[Content],
                       appender: _Appender | None = None) -> pb.AppendResponse:
        """One append RPC; `_AttemptFailed` on a transport failure.

        Content that fits one message goes in one AppendWhole call while the channel is
        connected (a unary call costs a third of an Append stream). A whole append has
        no commit message sent apart, so any transport failure leaves it in doubt; while
        the channel is not connected, appends take the stream, whose failures before
        the commit are safely sent again."""
        appender = appender or self._broker
        if (len(messages) == 1 and self._whole_appends and appender.channel.get_state()
                is grpc.ChannelConnectivity.READY):
            try:
                return await appender.whole(WholeAppend(first, messages[0]))
            except grpc.aio.AioRpcError as err:
                if err.code() is not grpc.StatusCode.UNIMPLEMENTED:
                    raise _AttemptFailed(err, committing=True) from err
                self._whole_appends = False  # an older broker: nothing was appended
                log.info("broker %s does not serve AppendWhole: appending by stream",
                         self.address)

        async def send() -> AsyncIterator[Content]:
            for msg in messages:
                yield msg

        return await self._send(first, send(), appender)

    async def _send(self, first: pb.AppendRequest, messages: AsyncIterator[Content],
                    appender: _Appender | None = None) -> pb.AppendResponse:
        """Write an Append stream and commit it; the broker's answer, or `_AttemptFailed`
        (with whether the commit had been handed to gRPC) when the transport failed.

        A broker refusing an append answers at once, without reading its content, so a
        write may fail because the call already ended; gRPC then reports INTERNAL from
        the write, while the call itself holds the broker's real answer. So a failed
        write is never the outcome: the call is (boundedly) awaited for it."""
        call = (appender or self._broker).stream(None)
        committing = False
        write_error: grpc.aio.AioRpcError | None = None
        try:
            try:
                await call.write(first)
                async for msg in messages:
                    await call.write(msg)
                committing = True
                await call.write(_COMMIT)
                await call.done_writing()
            except asyncio.InvalidStateError:
                pass  # the call ended before we were done: read its outcome below
            except grpc.aio.AioRpcError as err:
                write_error = err
                log.debug("append to %s: a write failed (%s); awaiting the call's outcome",
                          first.journal, err.code().name)
            if write_error is None:
                return await call
            try:
                async with asyncio.timeout(self.timeout):
                    return await call
            except TimeoutError:
                raise _AttemptFailed(write_error, committing) from write_error
        except grpc.aio.AioRpcError as err:
            raise _AttemptFailed(err, committing) from err
        except BaseException:
            call.cancel()
            raise

    async def _append_streamed(self, journal: str, first: pb.AppendRequest,
                               content: AsyncIterable[bytes]) -> AppendResult:
        """An append of streamed content: sent once (it cannot be replayed), in large
        messages as it arrives."""
        packer = Packer()

        async def send() -> AsyncIterator[Content]:
            async for chunk in content:
                for msg in packer.add(chunk):
                    yield msg
            for msg in packer.finish():
                yield msg

        try:
            resp = await self._send(first, send())
            self._learn(journal, resp.header)
        except _AttemptFailed as failed:
            err = failed.err
            if failed.committing and err.code() in RETRYABLE:
                raise AppendUncertain(journal, f"the answer to its commit was lost "
                                      f"({err.code().name}: {err.details()}); streamed "
                                      f"content cannot be sent again") from err
            if err.code() not in RETRYABLE:
                raise rpc_error(err, journal) from err
            raise Unavailable("append", self.address, err.code().name,
                              f"{err.details()} (nothing was written; streamed content "
                              "cannot be sent again)", journal) from err
        return self._result(journal, resp)

    def _result(self, journal: str, resp: pb.AppendResponse) -> AppendResult:
        if resp.status != pb.OK:
            raise BrokerError(pb.Status.Name(resp.status), journal,
                              f"{resp.detail}; nothing was appended" if resp.detail
                              else "nothing was appended")
        commit = fragment_from_pb(resp.commit, "commit")
        APPENDS.inc()
        APPEND_BYTES.inc(commit.size)
        return AppendResult(commit, labels_from_pb(resp.registers, "registers"))

    async def _resolve(self, journal: str, offset: int, messages: list[Content],
                       size: int) -> AppendResult:
        """An uncertain append expected at `offset` met WRONG_APPEND_OFFSET when sent
        again: are the bytes at [offset, offset + size) ours?"""
        # SHA-1s of up to the whole append (256 MiB): summed off the loop.
        ours = hashlib.sha1()
        await asyncio.to_thread(_sum_into, ours, [p for msg in messages for p in msg.parts])
        theirs, got = hashlib.sha1(), 0
        async with contextlib.aclosing(self.read(journal, offset,
                                                 end_offset=offset + size)) as chunks:
            async for chunk in chunks:
                if chunk.offset != offset + got:
                    break  # a hole: not what we wrote
                await asyncio.to_thread(_sum_into, theirs, [chunk.content])
                got += len(chunk.content)
        if got != size or theirs.digest() != ours.digest():
            raise BrokerError("WRONG_APPEND_OFFSET", journal,
                              f"an uncertain append expected at offset {offset} did not "
                              f"commit: other content was written there first")
        log.info("uncertain append to %s at %d resolved: it had committed", journal, offset)
        commit = Fragment(journal, offset, offset + size, ours.digest())
        APPENDS.inc()
        APPEND_BYTES.inc(size)
        # The journal's registers after that append are not known any more.
        return AppendResult(commit, LabelSet())

    # -- reads ---------------------------------------------------------------------

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
        backoff = self._backoff("read", journal)
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
                    if err.status not in RETRYABLE_STATUSES:
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
                    raise BrokerError(pb.Status.Name(status), journal,
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
                               timeout=None if block else self.timeout)
        try:
            async for resp in call:
                if resp.status == pb.OK:
                    return resp
                if resp.status == pb.OFFSET_NOT_YET_AVAILABLE and not block:
                    return None
                raise BrokerError(pb.Status.Name(resp.status), journal,
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
        backoff = self._backoff("write_head", journal)
        while True:
            call = self._stub.Read(pb.ReadRequest(journal=journal, offset=-1,
                                                  metadata_only=True), timeout=self.timeout)
            try:
                async for resp in call:
                    if resp.status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                        return int(resp.write_head)
                    status = pb.Status.Name(resp.status)
                    if status not in RETRYABLE_STATUSES:
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

    # -- journals and specs ----------------------------------------------------------

    async def list(self, selector: Selector | str = "") -> Listing:
        """Journals whose labels match `selector` (all with an empty one), e.g.
        ``"prefix=foobar/, name not in (foobar/part-001)"``."""
        request = pb.ListRequest(selector=selector_to_pb(_selector(selector)))
        backoff = self._backoff("list")
        while True:
            call = self._stub.List(request, timeout=self.timeout)
            try:
                async for resp in call:
                    return _listing(resp)
                raise _ended_early("")
            except grpc.aio.AioRpcError as err:
                await backoff.wait(err)
            finally:
                call.cancel()

    async def watch(self, selector: Selector | str = "") -> AsyncIterator[Listing]:
        """A `Listing` of the journals matching `selector` now, and a fresh one after
        every change; reconnects after transport failures (a listing already yielded is
        not yielded again). Runs until closed (`contextlib.aclosing`)."""
        request = pb.ListRequest(selector=selector_to_pb(_selector(selector)), watch=True)
        backoff = self._backoff("watch")
        last = 0
        while True:
            request.watch_resume_revision = last
            call = self._stub.List(request)
            try:
                async for resp in call:
                    listing = _listing(resp)
                    backoff.reset()
                    if listing.revision == last:
                        continue
                    last = listing.revision
                    yield listing
                raise _ended_early("")
            except grpc.aio.AioRpcError as err:
                await backoff.wait(err)
            finally:
                call.cancel()

    async def apply(self, changes: Sequence[SpecChange[JournalSpec]]) -> Applied:
        """Apply `changes` (upserts, and deletes where `spec` is None) in one etcd
        transaction, each only if its journal is still at its expected mod `revision`
        (0: must not exist). Returns the transaction's revision and the broker's warnings
        about the specs (likely mistakes, applied all the same). Raises `ApplyConflict`
        if any revision is stale (nothing changed) and `ValidationError` naming the field
        the broker refused."""
        request = pb.ApplyRequest()
        for i, change in enumerate(changes):
            if not isinstance(change, SpecChange):
                raise ValidationError(f"changes[{i}]", "expected a SpecChange")
            item = request.changes.add(expect_mod_revision=change.revision)
            if change.spec is None:
                item.delete = change.name
            else:
                item.upsert.CopyFrom(journal_spec_to_pb(change.spec))
        backoff = self._backoff("apply")
        lost = False  # an attempt's answer was lost: it may have applied
        while True:
            try:
                resp = await self._stub.Apply(request, timeout=self.timeout)
            except grpc.aio.AioRpcError as err:
                lost = True
                await backoff.wait(err)
                continue
            names_ = [c.name for c in changes]
            if resp.status == pb.ETCD_TRANSACTION_FAILED:
                if lost:
                    applied = await self._applied(changes)
                    if applied:
                        return Applied(applied)
                raise ApplyConflict(resp.header.etcd.revision, names_)
            if resp.status != pb.OK:
                raise BrokerError(pb.Status.Name(resp.status), ", ".join(names_))
            return Applied(int(resp.header.etcd.revision), tuple(resp.warnings))

    async def _applied(self, changes: Sequence[SpecChange[JournalSpec]]) -> int:
        """After a lost answer and then a conflict: the revision our own earlier attempt
        applied at, if the journals now are exactly as the changes make them (all
        upserts at one mod revision, deletes gone); else 0."""
        wanted = Selector(LabelSet([("name", c.name) for c in changes]))
        listing = await self.list(wanted)
        found = {j.spec.name: j for j in listing.journals}
        revisions = set()
        for change in changes:
            got = found.get(change.name)
            if change.spec is None:
                if got is not None:
                    return 0
            elif got is None or got.spec != change.spec:
                return 0
            else:
                revisions.add(got.mod_revision)
        if len(revisions) > 1:
            return 0
        log.info("apply: an attempt whose answer was lost had applied the changes")
        return revisions.pop() if revisions else listing.revision

    # -- fragments -------------------------------------------------------------------

    async def fragments(self, journal: str, *, begin_mod_time: int = 0,
                        end_mod_time: int = 0, signature_ttl: timedelta | None = None,
                        page_limit: int = 0) -> AsyncIterator[builtins.list[FragmentInfo]]:
        """The journal's fragments in offset order, a page (of up to `page_limit`, 0:
        the broker's default) at a time. `begin_mod_time`/`end_mod_time` (Unix seconds)
        keep fragments persisted in that window; `signature_ttl` asks for signed URLs
        of persisted fragments."""
        names.validate_journal_name(journal, "journal")
        _check_offset(begin_mod_time, "begin_mod_time", 0)
        _check_offset(end_mod_time, "end_mod_time", 0)
        _check_offset(page_limit, "page_limit", 0, 2**31 - 1)  # an int32
        request = pb.FragmentsRequest(journal=journal, begin_mod_time=begin_mod_time,
                                      end_mod_time=end_mod_time, page_limit=page_limit)
        if signature_ttl:
            if signature_ttl < timedelta(0):
                raise ValidationError("signature_ttl", "must not be negative")
            request.signature_ttl.CopyFrom(duration_to_pb(signature_ttl))
        while True:
            backoff = self._backoff("fragments", journal)
            while True:
                try:
                    resp = await self._stub.ListFragments(request, timeout=self.timeout)
                    break
                except grpc.aio.AioRpcError as err:
                    await backoff.wait(err)
            if resp.status != pb.OK:
                raise BrokerError(pb.Status.Name(resp.status), journal, "listing fragments")
            yield [FragmentInfo(fragment_from_pb(item.spec, f"fragments[{i}]"),
                                item.signed_url, item.persist_error)
                   for i, item in enumerate(resp.fragments)]
            if not resp.next_page_token:
                return
            request.next_page_token = resp.next_page_token

    async def list_fragments(self, journal: str, *, begin_mod_time: int = 0,
                             end_mod_time: int = 0, signature_ttl: timedelta | None = None,
                             page_limit: int = 0) -> builtins.list[FragmentInfo]:
        """Every fragment of the journal (all pages of `fragments`)."""
        out: builtins.list[FragmentInfo] = []
        async for page in self.fragments(journal, begin_mod_time=begin_mod_time,
                                         end_mod_time=end_mod_time,
                                         signature_ttl=signature_ttl, page_limit=page_limit):
            out.extend(page)
        return out


def _sum_into(sha1: Any, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """Add `parts` to `sha1` (blocking: for a worker thread)."""
    for part in parts:
        sha1.update(part)


def _listing(resp: pb.ListResponse) -> Listing:
    if resp.status != pb.OK:
        raise BrokerError(pb.Status.Name(resp.status), "", "listing journals")
    journals = [ListedJournal(journal_spec_from_pb(j.spec), j.mod_revision, j.create_revision,
                              route_from_pb(j.route) if j.HasField("route") else Route())
                for j in resp.journals]
    journals.sort(key=lambda j: j.spec.name)
    return Listing(resp.header.etcd.revision, journals)


def _ended_early(journal: str) -> grpc.aio.AioRpcError:
    """A stream that ended where the protocol promises more: retried like a dropped
    connection (a broker shutting down ends streams this way)."""
    where = f" (reading {journal})" if journal else ""
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), f"the broker ended the stream early{where}",
                                None)
