"""A member's side of authorization and observation, as gRPC server interceptors
(`grpc_interceptor`'s asyncio ones), shared by brokers and consumer members.

- `AuthInterceptor` authenticates each call's bearer token and checks that it grants
  the capability the method needs (`Authorizer.capabilities`); the verified `Caller` is
  then `current_caller()` for the handler, which checks the item's labels against the
  token's selector (`require_scope`) and forwards the caller's own token
  (`Caller.metadata`) when the item is served elsewhere.
- `ObserveInterceptor` counts calls per method and status, times them, and (with
  ``--log.access``) logs one line per call.

Without signing keys authorization is off: every caller is `ANONYMOUS` (`UNRESTRICTED`),
as the outermost interceptor (`ObserveInterceptor`) names it. A request that no such
layer saw (gRPC interceptors, a member's HTTP middleware: `gazette.serving.http_listener`) has no
caller: `current_caller()` is then `NOBODY`, who may do nothing. Unrestricted is never
a default.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_interceptor.server import AsyncServerInterceptor
from prometheus_client import Counter, Histogram

from gazette.auth.channels import AUTHORIZATION, bearer
from gazette.auth.tokens import (
    NO_GRANT,
    UNRESTRICTED,
    AuthError,
    Capability,
    Claims,
    SigningKeys,
    Unauthenticated,
)
from gazette.labels import LabelSet

access_log = logging.getLogger("gazette.access")

RPCS = Counter("gazette_grpc_requests_total", "gRPC calls served, by method and status",
               ["method", "code"])
RPC_SECONDS = Histogram("gazette_grpc_request_seconds", "Duration of gRPC calls served",
                        ["method"], buckets=(.001, .005, .025, .1, .5, 2.5, 10, 60, 600))
AUTH_REFUSALS = Counter("gazette_auth_refusals_total",
                        "Requests refused by authorization, by reason", ["reason"])
for _reason in ("unauthenticated", "permission_denied"):  # exported at 0 (`status_of`)
    AUTH_REFUSALS.labels(_reason)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made the current request: their verified claims and raw token ("" when
    authorization is off), which a forward passes on."""

    claims: Claims
    token: str = ""

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return bearer(self.token)

    def require_scope(self, labels: LabelSet, item: str) -> None:
        self.claims.require_scope(labels, item)


#: The caller of every request with authorization off.
ANONYMOUS = Caller(UNRESTRICTED)
#: The caller of what no authentication layer named a caller of: granted nothing.
NOBODY = Caller(NO_GRANT)
_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("caller", default=NOBODY)


def current_caller() -> Caller:
    """The caller of the request being served, as its authentication layer named it
    (`ANONYMOUS` with authorization off); `NOBODY` outside one."""
    return _CALLER.get()


def set_caller(caller: Caller) -> contextvars.Token[Caller]:
    return _CALLER.set(caller)


#: Methods every member serves to anyone: the health service (probes carry no token).
OPEN_METHODS: Mapping[str, Capability | None] = {
    "/grpc.health.v1.Health/Check": None,
    "/grpc.health.v1.Health/Watch": None,
}


class Authorizer:
    """How a member authenticates callers: `keys` (None: authorization off) and the
    capability each method needs (`capabilities`: full method name to capability,
    None for methods anyone may call, as `OPEN_METHODS` are; others need `default`)."""

    def __init__(self, keys: SigningKeys | None,
                 capabilities: Mapping[str, Capability | None],
                 default: Capability | None = None) -> None:
        self.keys = keys
        self.capabilities = {**OPEN_METHODS, **capabilities}
        self.default = default

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def authenticate(self, authorization: str | None) -> Caller:
        """The caller an ``Authorization`` value (``Bearer <token>``) stands for."""
        if self.keys is None:
            return ANONYMOUS
        if not authorization:
            raise Unauthenticated("no token: send 'authorization: Bearer <token>' "
                                  "(gazctl --auth.token, or $AUTH_TOKEN)")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the authorization is not 'Bearer <token>'")
        token = token.strip()
        return Caller(self.keys.verify(token), token)

    def needs(self, method: str) -> Capability | None:
        return self.capabilities.get(method, self.default)


def status_of(err: AuthError) -> grpc.StatusCode:
    return grpc.StatusCode.UNAUTHENTICATED if isinstance(err, Unauthenticated) \
        else grpc.StatusCode.PERMISSION_DENIED


def count_refusal(err: AuthError) -> grpc.StatusCode:
    """Count a refusal (gRPC or HTTP) in ``gazette_auth_refusals_total``; its status."""
    code = status_of(err)
    AUTH_REFUSALS.labels(code.name.lower()).inc()
    return code


async def abort_refused(context: Any, err: AuthError) -> None:
    """End the call with `err`'s status and reason (counted)."""
    await context.abort(count_refusal(err), err.reason)


async def require_scope(context: Any, labels: LabelSet, item: str) -> None:
    """Abort the call (PERMISSION_DENIED) unless the caller's token covers `item`."""
    try:
        current_caller().require_scope(labels, item)
    except AuthError as err:
        await abort_refused(context, err)


def _metadata_value(context: Any, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else None
    return None


class AuthInterceptor(AsyncServerInterceptor):
    """Authenticates every call and checks its method's capability (see module doc)."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    async def intercept(self, method: Callable[..., Any], request_or_iterator: Any,
                        context: Any, method_name: str) -> Any:
        authorizer = self.authorizer
        if method_name in authorizer.capabilities and authorizer.needs(method_name) is None:
            return await _invoke(method, request_or_iterator, context)  # open
        try:
            caller = authorizer.authenticate(_metadata_value(context, AUTHORIZATION))
            need = authorizer.needs(method_name)
            if need is not None:
                caller.claims.require(need, method_name.rsplit("/", 1)[-1])
        except AuthError as err:
            if hasattr(request_or_iterator, "__aiter__"):
                await drain_refused(request_or_iterator)
            await abort_refused(context, err)
        set_caller(caller)
        return await _invoke(method, request_or_iterator, context)


#: A refused request stream is read (and dropped) for up to this long first: a stream
#: ended by the server before the client finished sending may reach the client as
#: INTERNAL instead of the refusal (seen with TLS), and a forwarding member would then
#: not know that nothing was written.
REFUSAL_DRAIN_SECONDS = 2.0
REFUSAL_DRAIN_MESSAGES = 64


async def drain_refused(requests: AsyncIterator[Any]) -> None:
    """Read and drop the rest of a refused request stream (bounded), so the refusal
    reaches the client as sent."""
    with contextlib.suppress(Exception, TimeoutError):
        async with asyncio.timeout(REFUSAL_DRAIN_SECONDS):
            count = 0
            async for _ in requests:
                count += 1
                if count >= REFUSAL_DRAIN_MESSAGES:
                    return


async def _invoke(method: Callable[..., Any], request: Any, context: Any) -> Any:
    out = method(request, context)
    return out if hasattr(out, "__aiter__") else await out


class ObserveInterceptor(AsyncServerInterceptor):
    """Per-method call counts by status, durations, and (`access`) one log line per
    call: method, status, seconds, peer, caller. With `caller` (authorization off:
    `ANONYMOUS`), it names every call's caller, as `AuthInterceptor` does when on."""

    def __init__(self, access: bool = False, caller: Caller | None = None) -> None:
        self.access, self.caller = access, caller

    async def intercept(self, method: Callable[..., Any], request_or_iterator: Any,
                        context: Any, method_name: str) -> Any:
        start = time.monotonic()
        if self.caller is not None:
            set_caller(self.caller)
        try:
            out = method(request_or_iterator, context)
            if hasattr(out, "__aiter__"):
                return self._stream(out, context, method_name, start)
            result = await out
        except BaseException as exc:
            self._done(context, method_name, start, exc)
            raise
        self._done(context, method_name, start, None)
        return result

    async def _stream(self, responses: AsyncIterator[Any], context: Any, method_name: str,
                      start: float) -> AsyncIterator[Any]:
        error: BaseException | None = None
        try:
            async for response in responses:
                yield response
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._done(context, method_name, start, error)

    def _done(self, context: Any, method_name: str, start: float,
              error: BaseException | None) -> None:
        code = _code(context, error)
        name = method_name.rsplit("/", 1)[-1]
        seconds = time.monotonic() - start
        RPCS.labels(name, code).inc()
        RPC_SECONDS.labels(name).observe(seconds)
        if self.access and access_log.isEnabledFor(logging.INFO):
            access_log.info("%s %s %.3fs peer=%s caller=%s", method_name, code, seconds,
                            context.peer(), current_caller().claims.subject)


def _code(context: Any, error: BaseException | None) -> str:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - a context without code(): fall back below
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int) and not isinstance(code, bool):
        return next((c.name for c in grpc.StatusCode if c.value[0] == code), str(code))
    if error is None:
        return "OK"
    if isinstance(error, GeneratorExit) or type(error).__name__ == "CancelledError":
        return "CANCELLED"
    return "UNKNOWN"


def server_interceptors(authorizer: Authorizer, access_log_on: bool = False
                        ) -> list[AsyncServerInterceptor]:
    """A member's interceptors, outermost first: observation sees refusals too. With
    authorization off there is nothing to check: observation names every call's caller
    `ANONYMOUS`, so no auth layer costs a plain member's calls anything."""
    if not authorizer.enabled:
        return [ObserveInterceptor(access_log_on, caller=ANONYMOUS)]
    return [ObserveInterceptor(access_log_on), AuthInterceptor(authorizer)]
