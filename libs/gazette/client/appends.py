"""The appends part of a `JournalClient`: retried only where that cannot append twice,
resolved when an answer is lost (see `gazette.client.journal` for the rules), and routed
to a journal's primary with ``route_appends``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from typing import Any

import grpc

from gazette import names
from gazette.client.connection import Connection, _check_offset, _not_str
from gazette.client.errors import AppendUncertain, BrokerError, Unavailable
from gazette.client.framed import AppendLost, DataPaths, FramedConnection
from gazette.client.metrics import APPEND_BYTES, APPENDS
from gazette.client.reads import Reads
from gazette.client.results import AppendResult
from gazette.client.retry import (
    RETRYABLE,
    rpc_error,
)
from gazette.client.wire import (
    Content,
    Packer,
    WholeAppend,
    encode_append,
    pack,
    parse_address,
)
from gazette.errors import GazetteError, ValidationError
from gazette.fragment import Fragment, fragment_from_pb
from gazette.labels import LabelSet, Selector
from gazette.pb import broker_pb2 as pb
from gazette.protocol import (
    labels_from_pb,
    labels_to_pb,
    selector_to_pb,
)
from gazette.protocol.status import Status

log = logging.getLogger(__name__)

#: What `append` takes: bytes-like content, or chunks of it (a sync iterable is
#: collected first so the append can be sent again; an async one is streamed once).
AppendContent = (bytes | bytearray | memoryview | Iterable[bytes | bytearray | memoryview]
                 | AsyncIterable[bytes])

_COMMIT = pb.AppendRequest()  # an empty content message commits the append


class ChainBroken(GazetteError):
    """A chained append was not made: the one before it on its connection did not
    commit (`Appends.append_chained`). Nothing was written: send it again after that
    one."""

    def __init__(self, journal: str, detail: str) -> None:
        super().__init__(f"append to {journal}: {detail}")
        self.journal = journal


class _AttemptFailed(Exception):
    """One Append attempt failed in transport; `committing`: its commit had been sent."""

    def __init__(self, err: grpc.aio.AioRpcError, committing: bool) -> None:
        super().__init__(str(err))
        self.err, self.committing = err, committing


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


class Appends:
    """`append` over a `Connection`, and what it takes to retry and resolve one
    (resolving reads back what was written, through `reads`). With `route_appends`, it
    sends a journal's appends to the primary its responses name, over channels of its
    own (closed by `close`)."""

    def __init__(self, connection: Connection, reads: Reads, *,
                 route_appends: bool = False, data_path: bool = True) -> None:
        self._connection = connection
        self._reads = reads
        self.route_appends = route_appends
        #: With `data_path`: journal -> its primary's data endpoint, once a response
        #: named one, and the connections to them.
        self._data_targets: dict[str, str] = {}
        self._data = DataPaths(connection.auth, connection.timeout) if data_path else None
        self._broker = _Appender(connection.channel)
        #: With `route_appends`: journal -> its primary's gRPC target, and an appender
        #: per target.
        self._primaries: dict[str, str] = {}
        self._appenders: dict[str, _Appender] = {}
        #: Cleared when the broker does not know AppendWhole (an older version).
        self._whole_appends = True

    async def close(self) -> None:
        """Close the channels to journals' primaries, and the data paths."""
        await asyncio.gather(*(a.channel.close(None) for a in self._appenders.values()))
        if self._data is not None:
            await self._data.close()

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
        backoff = self._connection.backoff("append", journal)
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
                resp = await self._by_data_path(journal, first, messages, size) or \
                    await self._attempt(first, messages, appender)
            except _AttemptFailed as failed:
                if appender is not self._broker:  # back to our own address
                    self._primaries.pop(journal, None)
                self._data_targets.pop(journal, None)
                # Only a transport failure leaves a sent commit in doubt: other codes are
                # the broker's own refusals, made before anything was written.
                # An empty append writes no content (its register changes, if any, are
                # idempotent): it is sent again, never in doubt.
                uncertain = size > 0 and (
                    uncertain or (failed.committing and failed.err.code() in RETRYABLE))
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
            status = Status.of(resp.status)
            if status.route_changing:
                await backoff.wait_status(status)
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
            channel = self._connection.channel_to(target)
            appender = self._appenders[target] = _Appender(channel)
        return appender

    async def _by_data_path(self, journal: str, first: pb.AppendRequest,
                            messages: Sequence[Content], size: int
                            ) -> pb.AppendResponse | None:
        """The answer to the append sent on the journal's data path; None where there
        is none to use (not known, unreachable, or the content does not fit a frame)."""
        endpoint = self._data_targets.get(journal) if self._data is not None else None
        if endpoint is None or self._data is None:
            return None
        conn = await self._data.get(endpoint)
        if conn is None or not conn.fits(size):
            return None
        try:
            return await conn.append(first, [p for msg in messages for p in msg.parts], size)
        except AppendLost as lost:
            raise _AttemptFailed(lost.err, committing=True) from lost.err
        except grpc.aio.AioRpcError as err:
            # As an AppendWhole call's: the whole append was sent, so a failure with a
            # retryable code (the broker's AppendUncertain among them) is in doubt.
            raise _AttemptFailed(err, committing=True) from err

    def data_path(self, journal: str) -> FramedConnection | None:
        """The open data-path connection `journal`'s appends go on now, if any."""
        endpoint = self._data_targets.get(journal)
        return self._data.connected(endpoint) \
            if endpoint is not None and self._data is not None else None

    async def append_chained(self, conn: FramedConnection, journal: str,
                             content: list[bytes], *, chained: bool) -> AppendResult:
        """One attempt to append `content` to `journal` on `conn` (no retries): with
        `chained`, only if the append before it on `conn` committed (`ChainBroken`
        otherwise). A refusal (a broker status, a token or argument refused: nothing
        written, it may be sent again) raises as `append` would; a lost answer, or a
        failure with a retryable code, `AppendUncertain`."""
        size = sum(len(c) for c in content)
        try:
            resp = await conn.append(pb.AppendRequest(journal=journal), content, size,
                                     chained=chained)
        except AppendLost as lost:
            raise AppendUncertain(journal, f"the answer to its commit was lost "
                                  f"({lost.err.details()})") from lost.err
        except grpc.aio.AioRpcError as err:
            if err.code() is grpc.StatusCode.ABORTED:  # (only the chain rule's)
                raise ChainBroken(journal, err.details() or "") from err
            if err.code() in RETRYABLE:  # (as in `_by_data_path`: in doubt)
                raise AppendUncertain(journal, f"its append failed after it was sent "
                                      f"({err.code().name}: {err.details()})") from err
            raise rpc_error(err, journal) from err
        self._learn(journal, resp.header)
        return self._result(journal, resp)

    def _learn(self, journal: str, header: pb.Header) -> None:
        """Remember the primary a response's route names (with `route_appends`), and
        its data endpoint (with a data path)."""
        route = header.route
        if self._data is not None:
            data = route.data_endpoints[route.primary] \
                if 0 <= route.primary < len(route.data_endpoints) else ""
            if data:
                self._data_targets[journal] = data
            else:
                self._data_targets.pop(journal, None)
        if not self.route_appends or not 0 <= route.primary < len(route.endpoints):
            return
        try:
            target = parse_address(route.endpoints[route.primary])
        except ValidationError:
            return
        if target == self._connection.address:
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
                # Bounded like any unary call: one that neither starts nor fails (seen
                # after a broker's SIGKILL, no broker holding it) ends in doubt.
                return await appender.whole(WholeAppend(first, messages[0]),
                                            timeout=self._connection.timeout)
            except grpc.aio.AioRpcError as err:
                if err.code() is not grpc.StatusCode.UNIMPLEMENTED:
                    raise _AttemptFailed(err, committing=True) from err
                self._whole_appends = False  # an older broker: nothing was appended
                log.info("broker %s does not serve AppendWhole: appending by stream",
                         self._connection.address)

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
                async with asyncio.timeout(self._connection.timeout):
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
            raise Unavailable("append", self._connection.address, err.code().name,
                              f"{err.details()} (nothing was written; streamed content "
                              "cannot be sent again)", journal) from err
        return self._result(journal, resp)

    def _result(self, journal: str, resp: pb.AppendResponse) -> AppendResult:
        if resp.status != pb.OK:
            raise BrokerError(Status.of(resp.status), journal,
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
        async with contextlib.aclosing(self._reads.read(
                journal, offset, end_offset=offset + size)) as chunks:
            async for chunk in chunks:
                if chunk.offset != offset + got:
                    break  # a hole: not what we wrote
                await asyncio.to_thread(_sum_into, theirs, [chunk.content])
                got += len(chunk.content)
        if got != size or theirs.digest() != ours.digest():
            raise BrokerError(Status.WRONG_APPEND_OFFSET, journal,
                              f"an uncertain append expected at offset {offset} did not "
                              f"commit: other content was written there first")
        log.info("uncertain append to %s at %d resolved: it had committed", journal, offset)
        commit = Fragment(journal, offset, offset + size, ours.digest())
        APPENDS.inc()
        APPEND_BYTES.inc(size)
        # The journal's registers after that append are not known any more.
        return AppendResult(commit, LabelSet())


def _sum_into(sha1: Any, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """Add `parts` to `sha1` (blocking: for a worker thread)."""
    for part in parts:
        sha1.update(part)
