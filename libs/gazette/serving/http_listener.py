"""A member's HTTP listener: the operational endpoints ``GET /metrics``
(Prometheus) and ``GET /healthz`` (200 while the member serves, else 503, for probes),
`http_app`, an application whose every other route needs a token (as the member's gRPC
methods do), and `HttpRunner`, which serves an application with bounds on idle and
malformed connections."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from gazette.auth import (
    ANONYMOUS,
    AuthError,
    Authorizer,
    Caller,
    Unauthenticated,
    count_refusal,
    set_caller,
)

#: Seconds a connection may go without a whole request head (from its opening, or from
#: the end of its previous response) before it is closed: silent and idle keep-alive
#: connections, and slow-loris clients that send their headers a byte at a time, alike.
#: (aiohttp's default is 3,630 s; a request being served is not limited by it, nor is
#: its body: an append body that stalls is the gateway's `append_idle_timeout`'s.)
IDLE_TIMEOUT = 10.0
#: Connections the kernel holds for a listener until it accepts them. Past it, a
#: burst's connection attempts are dropped and retried 1, 3, 7 s later (aiohttp's
#: default, 128, had half of a burst of 2,000 still waiting after 30 s); the kernel
#: caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096


async def metrics(request: web.Request) -> web.Response:
    body = prometheus_client.generate_latest(prometheus_client.REGISTRY)
    return web.Response(body=body,
                        headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


def healthz(ready: Callable[[], bool]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not serving\n")

    return handler


def add_ops_routes(app: web.Application, ready: Callable[[], bool]
                   ) -> list[web.AbstractRoute]:
    """``GET`` (and ``HEAD``) ``/metrics`` and ``/healthz`` on `app`; their routes."""
    out = []
    for path, handler in (("/metrics", metrics), ("/healthz", healthz(ready))):
        out += [app.router.add_get(path, handler, allow_head=False),
                app.router.add_head(path, handler)]
    return out


HttpCheck = Callable[[web.Request, Caller], None]
"""Whether an authenticated caller may make a request (the capability it needs, the
item's scope): raises `gazette.auth.AuthError` if not (or an HTTP error of its own, a
400 for a malformed name, say)."""


def http_app(ready: Callable[[], bool], authorizer: Authorizer, check: HttpCheck,
             client_max_size: int = 1 << 20) -> web.Application:
    """A member's HTTP application: the ops routes (`add_ops_routes`: probes and
    Prometheus carry no token), and every other request, whatever its path (``PUT
    /healthz`` is no probe) or whether any route takes it, authorized as gRPC calls
    are: a bearer token `authorizer` verifies, then `check`. A refusal (there, or an
    `AuthError` the handler raises) is 401 with ``WWW-Authenticate`` or 403, with the
    reason. The caller is then `current_caller()` for the handler (`ANONYMOUS` with
    authorization off)."""
    open_routes: set[web.AbstractRoute] = set()

    @web.middleware
    async def authorize(request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
        if request.match_info.route in open_routes:
            return await handler(request)
        if not authorizer.enabled:
            set_caller(ANONYMOUS)
            return await handler(request)
        try:
            caller = authorizer.authenticate(request.headers.get("Authorization"))
            check(request, caller)
            set_caller(caller)
            return await handler(request)
        except AuthError as err:
            raise _refusal(err) from None

    app = web.Application(client_max_size=client_max_size, middlewares=[authorize])
    open_routes.update(add_ops_routes(app, ready))
    return app


def _refusal(err: AuthError) -> web.HTTPException:
    count_refusal(err)
    if isinstance(err, Unauthenticated):
        return web.HTTPUnauthorized(text=f"UNAUTHENTICATED: {err.reason}\n",
                                    headers={"WWW-Authenticate": 'Bearer realm="gazette"'})
    return web.HTTPForbidden(text=f"PERMISSION_DENIED: {err.reason}\n")


def _quiet_malformed(record: logging.LogRecord) -> bool:
    """A malformed request is the client's mistake (or a port scan), and it got its
    4xx: one debug line instead of aiohttp's "Error handling request" traceback."""
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, HttpProcessingError):
        return True  # a handler's own failure keeps its traceback
    remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
    logging.getLogger(record.name.removesuffix(".server")).debug(
        "malformed HTTP request from %s: %s", remote,
        " ".join(str(exc.message).split())[:200])
    return False


class _RefusingHandler(RequestHandler):
    """A connection that stops reading once a request on it failed to parse.

    aiohttp answers a malformed request with a 400 and closes, but until it does it goes
    on parsing what arrives, and each parse error's traceback holds the frame that read
    the chunk (up to 256 KiB): a reference cycle that only a garbage collection frees.
    A flood of huge malformed requests then held hundreds of MiB (the fuzz suite's
    `test_http_header_floods_leave_nothing_behind`). Here the rest is dropped and the
    error loses its traceback, so the chunks are freed at once."""

    __slots__ = ("_refused",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        for message, _ in self._messages:
            error = getattr(message, "exc", None)
            if isinstance(error, BaseException):
                self._refused = True
                while error is not None:
                    error.__traceback__ = None
                    error = error.__cause__ or error.__context__


class _RefusingServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _RefusingHandler(self, loop=self._loop, **self._kwargs)


class HttpRunner(web.AppRunner):
    """Serves `app` without aiohttp's access log or signal handling, closing connections
    idle for `IDLE_TIMEOUT`, reading nothing more from one that sent a malformed request
    (see `_RefusingHandler`) and logging those in one debug line on `log_name` (not a
    traceback on `log_name`.server); requests in flight at `cleanup` get `grace`
    seconds."""

    def __init__(self, app: web.Application, *, grace: float, log_name: str) -> None:
        server_log = logging.getLogger(f"{log_name}.server")
        if _quiet_malformed not in server_log.filters:
            server_log.addFilter(_quiet_malformed)
        super().__init__(app, access_log=None, handle_signals=False, logger=server_log,
                         shutdown_timeout=grace, keepalive_timeout=IDLE_TIMEOUT)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _RefusingServer
        return server

    async def listen(self, host: str | None, port: int, ssl: Any = None) -> int:
        """Set up and listen on `host`:`port` (port 0: a free one; host None: every
        address), over TLS with the `ssl` context; returns the port."""
        await self.setup()
        site = web.TCPSite(self, host, port, reuse_address=True, ssl_context=ssl,
                           backlog=LISTEN_BACKLOG)
        await site.start()
        return int(self.addresses[0][1])
