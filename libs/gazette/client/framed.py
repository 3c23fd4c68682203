"""A client's data-path connections (`gazette.protocol.frames`): appends to a journal's
primary pipelined on one connection and answered in order, beside gRPC.

`Appends` sends an append here when the journal's route names its primary's data
endpoint (brokers serve one with ``--broker.data-port``) and the content fits a frame;
everything else, and every append while a data endpoint cannot be reached, goes by
gRPC. Failures come back as gRPC's errors (`grpc.aio.AioRpcError`), so an append is
retried, and resolved when its answer was lost, by the rules of an AppendWhole call
(the whole append was sent): a connection lost after an append was written, or a FAILED
frame with a retryable code (the broker's own doubt: a replication that failed after
its proposal), leaves it in doubt; other FAILED codes and broker statuses are refusals
(nothing written).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import Sequence

import grpc

from gazette.auth import ClientAuth
from gazette.errors import ValidationError
from gazette.pb import broker_pb2 as pb
from gazette.protocol import data_address, frames
from gazette.protocol.frames import FrameError, Kind

log = logging.getLogger(__name__)

#: Seconds a data endpoint that could not be reached is not tried again.
UNREACHABLE_SECONDS = 30.0
#: The socket's write buffer is drained past this many bytes of frames.
WRITE_HIGH = 4 << 20
#: What an APPEND frame holds besides the content, at most (its request and sums).
FRAME_OVERHEAD = frames.MAX_META + 16


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details,
                                None)


def _status(code: int) -> grpc.StatusCode:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return status
    return grpc.StatusCode.UNKNOWN


class AppendLost(Exception):
    """The connection ended after the append was written: it may have committed."""

    def __init__(self, err: grpc.aio.AioRpcError) -> None:
        super().__init__(err.details())
        self.err = err


class FramedConnection:
    """One connection to a broker's data path (opened at the first append)."""

    def __init__(self, endpoint: str, auth: ClientAuth, timeout: float) -> None:
        self.endpoint = endpoint
        self.host, self.port, self.tls = data_address(endpoint)
        self.auth, self.timeout = auth, timeout
        self.max_body = 0
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._pending: collections.deque[asyncio.Future[pb.AppendResponse]] = \
            collections.deque()
        self.closed = False

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self.closed

    def fits(self, size: int) -> bool:
        """Whether content of `size` bytes fits one frame (known once connected)."""
        return 0 < size <= self.max_body - FRAME_OVERHEAD

    async def connect(self) -> None:
        """Connect and say HELLO (once, shared by concurrent callers); raises
        `OSError` or `AioRpcError` (the broker's GOAWAY) on failure."""
        if self._writer is not None:
            return
        task = self._connecting
        if task is None:
            task = self._connecting = asyncio.ensure_future(self._connect())
        try:
            await asyncio.shield(task)
        finally:
            if task.done() and self._connecting is task:
                self._connecting = None

    async def _connect(self) -> None:
        ctx = None
        if self.tls:
            ctx = (self.auth.tls.client_context() if self.auth.tls is not None else
                   ssl.create_default_context())
        async with asyncio.timeout(self.timeout):
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=ctx, limit=1 << 20)
            try:
                writer.write(frames.hello(self.auth.current_token()))
                kind, body = await _frame(reader, frames.MAX_META)
                if kind is Kind.GOAWAY:
                    code, detail = frames.parse_refusal(body)
                    raise _error(_status(code), f"{detail} (data path {self.endpoint})")
                if kind is not Kind.READY:
                    raise FrameError("frame.kind", f"expected READY, got {kind.name}")
                self.max_body = frames.parse_ready(body)
            except BaseException:
                writer.close()
                raise
        self._writer = writer
        self._reader_task = asyncio.ensure_future(self._read(reader))

    async def append(self, request: pb.AppendRequest,
                     content: Sequence[bytes | bytearray | memoryview], size: int, *,
                     chained: bool = False) -> pb.AppendResponse:
        """Append `content` (`size` bytes, which `fits`) under `request`: the broker's
        answer; `AioRpcError` for a FAILED frame (ABORTED: `chained`, and the append
        before it on this connection did not commit: nothing written; other codes as
        gRPC's, see the module doc), `AppendLost` if the connection ended after the
        frame was written."""
        writer = self._writer
        if writer is None or self.closed:
            raise _error(grpc.StatusCode.UNAVAILABLE, f"data path {self.endpoint} closed")
        answer: asyncio.Future[pb.AppendResponse] = \
            asyncio.get_running_loop().create_future()
        self._pending.append(answer)
        writer.writelines(frames.append_parts(request, list(content), size, chained=chained))
        if writer.transport.get_write_buffer_size() > WRITE_HIGH:
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        return await answer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        """Answer the pending appends in order, until the connection ends."""
        reason = _error(grpc.StatusCode.UNAVAILABLE,
                        f"the data path connection to {self.endpoint} ended")
        try:
            while True:
                kind, body = await _frame(reader, 1 << 30)
                if kind is Kind.GOAWAY:
                    code, detail = frames.parse_refusal(body)
                    status = _status(code)
                    reason = _error(status if status is not grpc.StatusCode.OK
                                    else grpc.StatusCode.UNAVAILABLE,
                                    f"{detail} (data path {self.endpoint})")
                    log.info("data path %s: the broker ended the connection: %s",
                             self.endpoint, detail)
                    return
                if not self._pending:
                    raise FrameError("frame", f"an answer ({kind.name}) to no append")
                answer = self._pending.popleft()
                if kind is Kind.APPENDED:
                    answer.set_result(frames.parse_appended(body))
                elif kind is Kind.FAILED:
                    code, detail = frames.parse_refusal(body)
                    answer.set_exception(_error(_status(code), detail))
                else:
                    raise FrameError("frame.kind", f"a broker sends no {kind.name}")
        except (OSError, asyncio.IncompleteReadError, FrameError) as err:
            reason = _error(grpc.StatusCode.UNAVAILABLE,
                            f"the data path connection to {self.endpoint} failed: {err}")
        finally:
            self.closed = True
            while self._pending:
                answer = self._pending.popleft()
                if not answer.done():
                    answer.set_exception(AppendLost(reason))
            if self._writer is not None:
                self._writer.close()

    async def close(self) -> None:
        self.closed = True
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task


async def _frame(reader: asyncio.StreamReader, max_body: int) -> tuple[Kind, bytes]:
    kind, length, _ = frames.parse_header(await reader.readexactly(frames.HEADER.size),
                                          max_body)
    return kind, await reader.readexactly(length)


class DataPaths:
    """A client's data-path connections, one per broker endpoint, and which endpoints
    could not be reached lately."""

    def __init__(self, auth: ClientAuth, timeout: float) -> None:
        self.auth, self.timeout = auth, timeout
        self._connections: dict[str, FramedConnection] = {}
        self._unreachable: dict[str, float] = {}

    async def get(self, endpoint: str) -> FramedConnection | None:
        """A connected data path to `endpoint`, or None (it could not be reached in the
        last `UNREACHABLE_SECONDS`, or just now: the caller appends by gRPC)."""
        conn = self._connections.get(endpoint)
        if conn is not None and conn.closed:
            del self._connections[endpoint]
            conn = None
        if conn is None:
            if time.monotonic() < self._unreachable.get(endpoint, 0.0):
                return None
            try:
                conn = FramedConnection(endpoint, self.auth, self.timeout)
            except ValidationError as err:  # (a broker advertising a bad endpoint)
                log.warning("data path %r cannot be used: %s", endpoint, err)
                self._unreachable[endpoint] = time.monotonic() + UNREACHABLE_SECONDS
                return None
            self._connections[endpoint] = conn
        try:
            await conn.connect()
        except (OSError, TimeoutError, grpc.aio.AioRpcError, ValidationError) as err:
            log.warning("data path %s cannot be used (%s): appending by gRPC for %g s",
                        endpoint, err, UNREACHABLE_SECONDS)
            self._unreachable[endpoint] = time.monotonic() + UNREACHABLE_SECONDS
            self._connections.pop(endpoint, None)
            await conn.close()
            return None
        return conn

    def connected(self, endpoint: str) -> FramedConnection | None:
        """The open connection to `endpoint`, if there is one (none is opened)."""
        conn = self._connections.get(endpoint)
        return conn if conn is not None and conn.connected else None

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._connections.values()))
        self._connections.clear()
