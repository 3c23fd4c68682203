"""Requests that are not what their method takes, refused with INVALID_ARGUMENT.

grpc.aio answers a request message its deserializer cannot parse with UNKNOWN
("Unexpected <class 'DecodeError'>") and logs a traceback for each one; and a unary
method whose request stream ends before a whole message (none, or a truncated one) is
never answered at all: the call stays open until the client gives up. `guarded` wraps a
service's method handlers so that both are refused with INVALID_ARGUMENT and a message
naming the field where one can be found (``journal: not valid UTF-8 (byte 3)``), and
the handler never sees the request. `GuardedServer` does the same for every service an
application adds to a server (generated registrations or generic handlers of its own).

A client-streaming call the server ends while the client still sends reaches a grpc
client as INTERNAL ("Internal error from Core") about half the time, instead of the
status the server sent: a refusal of one (these, and the handler's own aborts) first
reads and drops what the client still sends, for a bounded time.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from gazette.auth import drain_refused
from gazette.protocol.content import read_varint

#: How deep `diagnose` follows nested messages.
MAX_DEPTH = 32
#: Repeated fields named without their own name, as the library's validation names
#: them (``selector.include[0].value``, not ``selector.include.labels[0].value``).
_FLATTENED = {"gazette.broker.LabelSet": "labels"}


class Malformed:
    """What a guarded deserializer returns for a message it cannot parse."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def diagnose(desc: Descriptor, raw: bytes, path: str = "", depth: int = 0) -> str:
    """Where `raw` (a serialized `desc`) is malformed, as ``field: reason``; "" if this
    walk of the wire format finds nothing (protobuf refused it for another reason)."""
    pos = 0
    seen: dict[int, int] = {}
    while pos < len(raw):
        try:
            key, pos = read_varint(raw, pos)
        except DecodeError as err:
            return f"{path or 'request'}: {err} at byte {pos}"
        number, wire = key >> 3, key & 7
        field = desc.fields_by_number.get(number)
        name = f"{path}{field.name}" if field is not None else f"{path}field {number}"
        if field is not None and field.is_repeated:
            if _FLATTENED.get(desc.full_name) == field.name:
                name = path.removesuffix(".")
            name += f"[{seen.get(number, 0)}]"
            seen[number] = seen.get(number, 0) + 1
        if wire == 0:
            try:
                _, pos = read_varint(raw, pos)
            except DecodeError as err:
                return f"{name}: {err}"
        elif wire == 1 or wire == 5:
            pos += 8 if wire == 1 else 4
            if pos > len(raw):
                return f"{name}: runs past the end of the message"
        elif wire == 2:
            try:
                length, pos = read_varint(raw, pos)
            except DecodeError as err:
                return f"{name}: {err}"
            if pos + length > len(raw):
                return f"{name}: its length ({length}) runs past the end of the message"
            chunk, pos = raw[pos:pos + length], pos + length
            if field is None:
                continue
            if field.type == FieldDescriptor.TYPE_STRING:
                try:
                    chunk.decode("utf-8")
                except UnicodeDecodeError as err:
                    return f"{name}: not valid UTF-8 (byte {err.start})"
            elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None \
                    and depth < MAX_DEPTH:
                found = diagnose(field.message_type, chunk, f"{name}.", depth + 1)
                if found:
                    return found
        else:
            return f"{name}: invalid wire type {wire}"
    return ""


def _deserializer(deserialize: Callable[[bytes], Any] | None, desc: Descriptor | None
                  ) -> Callable[[bytes], Any]:
    def guarded(raw: bytes) -> Any:
        try:
            return deserialize(raw) if deserialize is not None else raw
        except Exception as err:  # noqa: BLE001 - whatever the decoder refuses is malformed
            if desc is None:
                return Malformed(f"request: not a valid message ({err})")
            return Malformed(diagnose(desc, raw) or
                             f"request: not a valid {desc.full_name} ({err})")
    return guarded


async def _checked(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Malformed):
            await drain_refused(requests)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        yield request


async def _only(requests: AsyncIterator[Any], context: Any) -> Any:
    """The one request of a unary method, read from its request stream."""
    async for request in requests:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        return request
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        "request: the stream ended before a whole request message")


def _calling(behavior: Callable[..., Any], requests: Callable[[Any, Any], Any],
             draining: bool = False) -> Any:
    """`behavior` (an async function or async generator function of a request, or of a
    request stream, and the context) called with ``await requests(stream, context)``
    instead, as a function of the same kind (grpc.aio tells them apart by kind);
    `draining`: with a context whose `abort` drains the stream first."""
    if inspect.isasyncgenfunction(behavior):
        async def streaming(stream: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            request = await requests(stream, context)
            if draining:
                context = _DrainingContext(context, stream)
            async with contextlib.aclosing(behavior(request, context)) as responses:
                async for response in responses:
                    yield response
        return streaming

    async def called(stream: AsyncIterator[Any], context: Any) -> Any:
        request = await requests(stream, context)
        if draining:
            context = _DrainingContext(context, stream)
        return await behavior(request, context)
    return called


async def _all(stream: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    return _checked(stream, context)


class _DrainingContext:
    """A servicer context whose `abort` first drains the request stream (see
    `DRAIN_SECONDS`), so that a client still sending gets the refusal."""

    def __init__(self, context: Any, requests: AsyncIterator[Any]) -> None:
        self._context, self._requests = context, requests

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Any = ()) -> None:
        await drain_refused(self._requests)
        await self._context.abort(code, details, trailing_metadata)


def _message_of(deserialize: Callable[[bytes], Any] | None) -> Descriptor | None:
    """The message a deserializer makes, when it is a generated class's ``FromString``
    (a service outside the descriptor pool, as applications register by hand)."""
    desc = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    return desc if isinstance(desc, Descriptor) else None


def _guarded(handler: Any, desc: Descriptor | None) -> Any:
    behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary or \
        handler.stream_stream
    if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
        return handler  # synchronous: grpc.aio runs it only on a thread pool, as it is
    desc = desc or _message_of(handler.request_deserializer)
    deserializer = _deserializer(handler.request_deserializer, desc)
    serializer = handler.response_serializer
    # Every method reads its requests as a stream: a unary one's single request, too,
    # so that a stream without one is answered.
    if handler.unary_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _calling(handler.unary_unary, _only), deserializer, serializer)
    if handler.unary_stream is not None:
        return grpc.stream_stream_rpc_method_handler(
            _calling(handler.unary_stream, _only), deserializer, serializer)
    # A client-streaming method's refusal drains what the client still sends first.
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _calling(handler.stream_unary, _all, draining=True), deserializer, serializer)
    return grpc.stream_stream_rpc_method_handler(
        _calling(handler.stream_stream, _all, draining=True), deserializer, serializer)


def add_guarded(add_servicer: Callable[[Any, Any], None], servicer: Any,
                server: grpc.aio.Server,
                adjust: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Serve `servicer` on `server` as its generated ``add_*Servicer_to_server``
    (`add_servicer`) does, with its method handlers `guarded`; `adjust` may first
    replace handlers' (de)serializers in place (by method name)."""

    class Registrar:
        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            pass  # the same handlers arrive below, by name

        def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]
                                           ) -> None:
            if adjust is not None:
                adjust(handlers)
            _register(server, name, handlers)

    add_servicer(servicer, Registrar())


def _register(server: grpc.aio.Server, name: str, handlers: dict[str, Any]) -> None:
    """`handlers` of service `name`, `guarded`, on `server` (registered and generic)."""
    handlers = guarded(handlers, name)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(  # type: ignore[attr-defined]
        name, handlers)  # (grpc-stubs predate it)


class _GuardedGeneric(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """A generic handler whose method handlers are `guarded` (each once, when first
    called)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._done: dict[str, tuple[Any, Any]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        path = handler_call_details.method
        done = self._done.get(path)
        if done is None or done[0] is not handler:
            service, _, method = path.lstrip("/").rpartition("/")
            done = self._done[path] = (handler, guarded({method: handler}, service)[method])
        return done[1]


class GuardedServer:
    """A `grpc.aio.Server` as an application sees it (`AppServices.grpc_server`): every
    service added to it, through a generated ``add_*Servicer_to_server`` or generic
    handlers of its own, is `guarded` (the server's interceptors apply to it too, as to
    every call). Anything else is the server's."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GuardedGeneric(h) for h in handlers))

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        _register(self._server, name, dict(handlers))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def guarded(handlers: dict[str, Any], service: str) -> dict[str, Any]:
    """`handlers` (method name: `grpc.RpcMethodHandler`, as a generated
    ``add_*Servicer_to_server`` registers them) of `service` (its full name, e.g.
    ``gazette.broker.Journal``), each refusing malformed requests with INVALID_ARGUMENT
    (see the module's docstring). The handlers must be async (grpc.aio): coroutine or
    async generator functions."""
    try:
        methods = descriptor_pool.Default().FindServiceByName(service).methods_by_name
    except KeyError:
        methods = {}
    return {name: _guarded(handler, methods[name].input_type if name in methods else None)
            for name, handler in handlers.items()}
