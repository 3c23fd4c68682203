"""The data path's listener (`gazette.protocol.frames`): appends pipelined on one
connection, each served as the Append RPC serves it (`AppendRpcs`: the same routing,
forwarding, registers, offsets and authorization), answered in order.

Why beside gRPC: a gRPC append crosses grpc.aio's threads and the event loop several
times and its receive path costs several times a plain socket's; here a connection is
read by one task straight into each append's buffer, and a broker hashes each appended
byte once (into its fragment's SHA-1; the client's CRC-32 is checked instead of summing
the append apart).

A connection: the client's preface and HELLO (its token, authenticated and checked for
the Append capability as a call would be), READY; then APPEND frames, read up to
`depth` ahead of the one being served (the socket is not read further meanwhile: the
client's writes wait), each answered APPENDED or FAILED in order; one flagged CHAINED
is refused (ABORTED) unless the one before it committed. A malformed frame gets GOAWAY
once the appends before it are answered; the broker then reads and drops what the
client still sends for a while before it closes (a close with bytes unread resets the
connection, and the client could lose the GOAWAY).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable
from typing import Any, NoReturn

import grpc
from prometheus_client import Counter, Gauge

from gazette.auth import AuthError, Authorizer, set_caller
from gazette.auth.server import count_refusal
from gazette.errors import ValidationError
from gazette.pb import broker_pb2 as pb
from gazette.protocol import frames
from gazette.protocol.frames import FrameError, Kind
from gazette_broker.forward import APPEND_METHOD
from gazette_broker.service_appends import AppendRpcs

log = logging.getLogger(__name__)

CONNECTIONS = Gauge("gazette_framed_connections", "Open connections of the data path")
APPENDS = Counter("gazette_framed_appends_total",
                  "Appends served on the data path, by outcome (OK, a broker status, or "
                  "the gRPC code of a refusal)", ["outcome"])
GOAWAYS = Counter("gazette_framed_goaways_total",
                  "Data-path connections ended by the broker, by gRPC code", ["code"])

#: Seconds a new connection gets to send its preface and HELLO.
HELLO_SECONDS = 10.0
#: Seconds a frame begun may go without a byte before the connection is ended (a
#: slow-loris client; a connection idle between frames is kept).
FRAME_STALL_SECONDS = 30.0
#: A frame's body buffer is this large at first, and takes the length its header
#: claimed only once the client sent that much (a lying length holds little).
BODY_START = 128 << 10
#: Appends read ahead of the one being served, per connection.
DEFAULT_DEPTH = 64
#: The socket's write buffer is drained past this many bytes of answers.
WRITE_HIGH = 256 << 10
#: After a GOAWAY, what the client still sends is read and dropped for up to this long
#: and this many bytes before the connection closes: closed with bytes unread, it would
#: be reset, and the client could lose the GOAWAY (and the answers before it).
LINGER_SECONDS = 2.0
LINGER_BYTES = 16 << 20


class Refused(Exception):
    """An append refused as a gRPC call would be aborted: its `code` and `details`."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _Call:
    """What `AppendRpcs` needs of a gRPC call's context: `abort`, which here raises
    `Refused` (gRPC's raises its own exception too: nothing runs after it)."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise Refused(code, details)


def _code(code: grpc.StatusCode) -> int:
    return int(code.value[0])


class FramedServer:
    """The data path of one broker, serving appends through `rpcs`."""

    def __init__(self, authorizer: Authorizer, rpcs: AppendRpcs | None = None, *,
                 max_body: int = frames.DEFAULT_MAX_BODY, depth: int = DEFAULT_DEPTH,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """`rpcs` may come after `start` (the member spec names the port, the routing
        the member spec): connections are refused UNAVAILABLE until then."""
        self.rpcs, self.authorizer = rpcs, authorizer
        self.max_body, self.depth, self.ssl = max_body, depth, ssl_context
        APPENDS.labels("OK")  # exported at 0 while the data path serves no append
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str | None, port: int) -> int:
        """Listen on `host`:`port` (port 0: any free one); returns the port."""
        if host is None and port == 0:  # (else each address family gets its own port)
            host = "0.0.0.0"
        self._server = await asyncio.start_server(self._connection, host, port,
                                                  ssl=self.ssl, limit=1 << 20)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    @property
    def listening(self) -> list[tuple[str, int]]:
        """The (address, port) of each socket it listens on."""
        return [s.getsockname()[:2] for s in self._server.sockets] if self._server else []

    async def stop(self, grace: float) -> None:
        """Take no new connections; give open ones `grace` seconds to finish the
        appends they sent, then end them."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()  # (reading stops; the appends read are answered: see _serve)
        if self._connections:
            await asyncio.wait(self._connections, timeout=grace)
        for task in list(self._connections):
            task.cancel()  # (and now those too)
        if self._connections:
            await asyncio.wait(self._connections, timeout=1.0)
        self._server = None

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        CONNECTIONS.inc()
        try:
            if await self._serve(reader, writer):
                await _linger(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError) as err:
            log.debug("data path: a connection ended: %s", err)
        except asyncio.CancelledError:
            pass  # the broker stops
        finally:
            CONNECTIONS.dec()
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> bool:
        """Serve the connection; whether it ended with a GOAWAY."""
        if self.rpcs is None:
            return self._goaway(writer, grpc.StatusCode.UNAVAILABLE, "the broker is starting")
        try:
            async with asyncio.timeout(HELLO_SECONDS):
                token = await self._hello(reader)
            caller = self.authorizer.authenticate(f"Bearer {token}" if token else None)
            need = self.authorizer.needs(APPEND_METHOD)
            if need is not None:
                caller.claims.require(need, "Append")
        except TimeoutError:
            return self._goaway(writer, grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no preface and HELLO in {HELLO_SECONDS:g} s")
        except FrameError as err:
            return self._goaway(writer, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except AuthError as err:
            return self._goaway(writer, count_refusal(err), err.reason)
        set_caller(caller)  # (this task's context, which the worker's copies)
        writer.write(frames.ready(self.max_body))
        queue: asyncio.Queue[frames.Append | Refused | None] = asyncio.Queue(self.depth)
        worker = asyncio.create_task(self._work(queue, writer))
        refused = False
        try:
            try:
                while True:
                    item = await self._next(reader)
                    if item is None:
                        break
                    await queue.put(item)
                    if isinstance(item, Refused):
                        refused = True
                        break
            except asyncio.CancelledError:
                # The broker stops: no more is read, what was read is answered first (a
                # second cancel, at the end of `stop`'s grace, ends that too).
                if worker.done():
                    raise
            await queue.put(None)
            await worker
            return refused
        finally:
            if not worker.done():
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker

    async def _hello(self, reader: asyncio.StreamReader) -> str:
        preface = await reader.readexactly(len(frames.PREFACE))
        if preface != frames.PREFACE:
            raise FrameError("preface", f"expected {frames.PREFACE!r}: not a data-path "
                             "client")
        kind, length, _ = frames.parse_header(
            await reader.readexactly(frames.HEADER.size), frames.MAX_META)
        if kind is not Kind.HELLO:
            raise FrameError("frame.kind", f"expected HELLO, got {kind.name}")
        return frames.parse_hello(await reader.readexactly(length))

    async def _next(self, reader: asyncio.StreamReader) -> frames.Append | Refused | None:
        """The next append, a `Refused` that ends the connection, or None at its end."""
        head = await reader.read(frames.HEADER.size)
        if not head:
            return None
        try:
            if len(head) < frames.HEADER.size:
                head += await _stalled(reader.readexactly(frames.HEADER.size - len(head)))
            kind, length, flags = frames.parse_header(head, self.max_body)
            if kind is not Kind.APPEND:
                raise FrameError("frame.kind", f"a client sends APPEND, not {kind.name}")
            # Straight into the buffer (no joins of chunks), taken whole only once the
            # client sent its first `BODY_START` bytes.
            body = bytearray(min(length, BODY_START))
            got = 0
            while got < length:
                if got == len(body):
                    whole = bytearray(length)
                    whole[:got] = body
                    body = whole
                chunk = await _stalled(reader.read(min(len(body) - got, 1 << 20)))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", length)
                body[got:got + len(chunk)] = chunk
                got += len(chunk)
            return frames.parse_append(body, flags)
        except FrameError as err:
            return Refused(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except TimeoutError:
            return Refused(grpc.StatusCode.DEADLINE_EXCEEDED, f"a frame sent no byte for "
                           f"{FRAME_STALL_SECONDS:g} s")
        except asyncio.IncompleteReadError:  # (the appends before it are answered)
            return Refused(grpc.StatusCode.INVALID_ARGUMENT, "the connection ended inside "
                           "a frame")

    async def _work(self, queue: asyncio.Queue[frames.Append | Refused | None],
                    writer: asyncio.StreamWriter) -> None:
        """Serve the appends, answering each in order. One with an expected offset (not
        chained) starts at once, beside those before it: the broker orders appends by
        offset, so one sent ahead of the head waits for those that fill the gap, as
        separate gRPC calls would (served one after another, it would hold up the very
        appends it waits for). Any other starts once those before it ended: its order is
        the connection's; a CHAINED one is served only if the one before it committed."""
        answers: asyncio.Queue[asyncio.Task[tuple[bytes, bool]] | Refused | None] = \
            asyncio.Queue(self.depth)
        answering = asyncio.create_task(self._answer(answers, writer))
        running: list[asyncio.Task[tuple[bytes, bool]]] = []
        last: asyncio.Task[tuple[bytes, bool]] | None = None
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, Refused):
                    await answers.put(item)
                    break
                running = [t for t in running if not t.done()]
                ordered = item.chained or not item.request.offset
                last = asyncio.create_task(self._served(
                    item, tuple(running) if ordered else (), last if item.chained else None))
                running.append(last)
                await answers.put(last)  # (waits while `depth` answers are pending)
            await answers.put(None)
            await answering
        finally:
            for task in (answering, *running):
                task.cancel()

    async def _served(self, item: frames.Append, after: tuple[asyncio.Task[Any], ...],
                      chained_to: asyncio.Task[tuple[bytes, bool]] | None
                      ) -> tuple[bytes, bool]:
        """`item`'s answer, and whether it committed, once `after` ended."""
        if after:
            await asyncio.wait(after)
        try:
            if chained_to is not None and not chained_to.result()[1]:
                raise Refused(grpc.StatusCode.ABORTED, "the append before it on this "
                              "connection did not commit: nothing was appended")
            response = await self._append(item)
        except Refused as err:
            APPENDS.labels(err.code.name).inc()
            return frames.refusal(Kind.FAILED, _code(err.code), err.details), False
        except Exception as err:
            log.exception("data path: an append to %s failed", item.request.journal)
            APPENDS.labels("INTERNAL").inc()
            return frames.refusal(Kind.FAILED, _code(grpc.StatusCode.INTERNAL),
                                  f"the broker failed: {err!r}"), False
        return frames.appended(response), response.status == pb.OK

    async def _answer(self, answers: asyncio.Queue[asyncio.Task[tuple[bytes, bool]]
                                                  | Refused | None],
                      writer: asyncio.StreamWriter) -> None:
        """Write the answers in the order of their appends (then a GOAWAY, if any)."""
        while (task := await answers.get()) is not None:
            if isinstance(task, Refused):
                await writer.drain()
                self._goaway(writer, task.code, task.details)
                return
            frame, _ = await task
            writer.write(frame)
            if writer.transport.get_write_buffer_size() > WRITE_HIGH or answers.empty():
                await writer.drain()

    async def _append(self, append: frames.Append) -> pb.AppendResponse:
        try:
            if len(append.content) >= 1 << 20:  # (the CRC leaves the GIL: off the loop)
                await asyncio.to_thread(append.check)
            else:
                append.check()
        except ValidationError as err:
            raise Refused(grpc.StatusCode.DATA_LOSS, f"{err}; nothing was appended") from None
        assert self.rpcs is not None
        response: pb.AppendResponse = await self.rpcs.append(
            append.request, _content(append.content), _Call(), sum_content=False)
        APPENDS.labels(pb.Status.Name(response.status)).inc()
        return response

    def _goaway(self, writer: asyncio.StreamWriter, code: grpc.StatusCode,
                detail: str) -> bool:
        GOAWAYS.labels(code.name).inc()
        log.info("data path: ending a connection (%s: %s)", code.name, detail)
        writer.write(frames.refusal(Kind.GOAWAY, _code(code), detail))
        return True


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After a GOAWAY: the broker's side closed (where the transport can say so), then
    what the client still sends read and dropped until it stops, `LINGER_SECONDS` or
    `LINGER_BYTES`, so that closing does not reset the connection."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_SECONDS):
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            left = LINGER_BYTES
            while left > 0 and (chunk := await reader.read(min(left, 1 << 16))):
                left -= len(chunk)


async def _content(content: memoryview) -> AsyncIterator[memoryview]:
    yield content


async def _stalled(read: Awaitable[bytes]) -> bytes:
    """`read`, unless no byte comes for `FRAME_STALL_SECONDS` (`TimeoutError`)."""
    async with asyncio.timeout(FRAME_STALL_SECONDS):
        return await read
