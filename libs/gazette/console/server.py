"""`Console`: the web console's process part. An aiohttp application of server-rendered
pages (jinja2, autoescaped) over a `Backend`, served by the members' `HttpRunner`
(idle and malformed connections bounded), with ``/healthz`` and ``/metrics``.

Every page has a deadline (`ConsoleConfig.timeout`). Whatever goes wrong is a page: a
bad parameter 400 naming it, an unknown journal or shard 404, a broker's refusal with
its status (401/403 when it refuses the console's token), an unreachable broker, member
or etcd 503, a deadline passed 504; never a traceback. The one write, replaying dead
letters, is a POST whose form carries this process's token and must come from the
console's own pages (its Origin, else its Referer); the pages offer it only when the
console's token allows it, and the broker checks the token again.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Self

import jinja2
from aiohttp import web
from prometheus_client import Counter

from gazette.client import BrokerError, ShardError, ShardUnavailable, Unavailable
from gazette.console import event_pages, journal_pages, shard_pages
from gazette.console.backend import Backend
from gazette.console.config import ConsoleConfig, Resolved
from gazette.console.views import Forbidden, PageError
from gazette.errors import GazetteError, ValidationError
from gazette.gazctl.context import CommandError
from gazette.keyspace import EtcdError
from gazette.protocol.status import ShardStatus, Status
from gazette.serving.http_listener import HttpRunner, add_ops_routes

log = logging.getLogger("gazette.console")

PAGES = Counter("gazette_console_pages_total", "Pages the console served, by page and "
                "HTTP status", ["page", "code"])

HERE = Path(__file__).parent
#: The nav bar: (path, title).
NAV = (("/journals", "Journals"), ("/shards", "Shards"), ("/members", "Members"),
       ("/events", "Events"))
#: Headers of every answer: no script runs but our own, nothing is framed or cached.
HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'self'; "
           "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
           "Cache-Control": "no-store"}
REFUSED = ("UNAUTHENTICATED", "PERMISSION_DENIED")

Handler = Callable[[Backend, Mapping[str, str]], Awaitable[tuple[str, dict[str, Any]]]]


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    return env


class Console:
    """The console: ``async with Console(config) as console`` serves at `console.url`
    until the block ends (or `start`, `wait`, `stop`, as `serve_until_signalled`
    runs a member). A bad config is a `ValidationError` naming the flag, here."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.resolved = Resolved.of(config)
        #: This process's form token: a replay's form must carry it.
        self.csrf = secrets.token_urlsafe(32)
        self.templates = templates()
        self.port = 0
        self._backend: Backend | None = None
        self._runner: HttpRunner | None = None
        self._stopped = asyncio.Event()

    @property
    def url(self) -> str:
        host = self.config.bind if self.config.bind not in ("", "0.0.0.0", "::") \
            else "localhost"
        return f"http://{host}:{self.port}/"

    @property
    def backend(self) -> Backend:
        assert self._backend is not None, "start() the console first"
        return self._backend

    async def start(self) -> None:
        self._backend = Backend(self.config, self.resolved)
        try:
            await self._backend.open()
            self._runner = HttpRunner(self.app(), grace=1.0, log_name="gazette.console")
            self.port = await self._runner.listen(self.config.bind or None,
                                                  self.config.port)
        except BaseException:
            await self.stop()
            raise
        log.info("console serving at %s (broker %s)", self.url, self.backend.broker)

    async def wait(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._backend is not None:
            await self._backend.close()
        self._stopped.set()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the application -----------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 10, middlewares=[self._answer])
        add_ops_routes(app, lambda: self._runner is not None)
        app.router.add_get("/", self._home)
        for path, handler in (("/journals", journal_pages.journals),
                              ("/journal", journal_pages.journal),
                              ("/messages", journal_pages.messages),
                              ("/shards", shard_pages.shards), ("/shard", shard_pages.shard),
                              ("/members", shard_pages.members),
                              ("/events", event_pages.events),
                              ("/events/dead-letters", event_pages.dead_letters)):
            app.router.add_get(path, self._page(handler))
        app.router.add_post("/events/replay", self._replay)
        app.router.add_static("/static", HERE / "static")
        return app

    async def _home(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/journals")

    def _page(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def page(request: web.Request) -> web.Response:
            async with asyncio.timeout(self.config.timeout):
                template, context = await handler(self.backend, request.query)
            return self.render(request, template, context)

        return page

    async def _replay(self, request: web.Request) -> web.Response:
        self.check_origin(request)
        form = await request.post()
        values = {k: v for k, v in form.items() if isinstance(v, str)}
        if not hmac.compare_digest(values.get("csrf", "").encode(), self.csrf.encode()):
            raise Forbidden("the form is not this console's, or is from before it "
                            "restarted: reload the page and submit it again")
        async with asyncio.timeout(self.config.timeout):
            template, context = await event_pages.replay(self.backend, values)
        return self.render(request, template, context)

    def check_origin(self, request: web.Request) -> None:
        """A POST must come from the console's own pages: its Origin (else Referer)
        names this host."""
        source = request.headers.get("Origin") or request.headers.get("Referer") or ""
        if not source:
            raise Forbidden("a write needs the Origin (or Referer) of the console's own "
                            "page; this request has neither")
        if urllib.parse.urlsplit(source).netloc != request.host:
            raise Forbidden(f"a write from another site ({source}) is refused")

    def render(self, request: web.Request, template: str, context: dict[str, Any],
               status: int = 200) -> web.Response:
        backend = self._backend
        common = {"nav": NAV, "path": request.path, "csrf": self.csrf,
                  "grant": backend.grant if backend else None,
                  "broker": backend.broker if backend else ""}
        text = self.templates.get_template(template).render(**common, **context)
        return web.Response(text=text, status=status, content_type="text/html")

    @web.middleware
    async def _answer(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        """Every failure as an error page, every answer with `HEADERS`."""
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = self.error_page(request, exc.status, exc.reason,
                                       f"{request.method} {request.path}: {exc.reason}")
        except Exception as exc:  # every failure is a page, not a traceback
            status, title, reason, field = self.classify(exc)
            if status >= 500 and status not in (502, 503, 504):
                log.error("page %s failed", request.path, exc_info=exc)
            response = self.error_page(request, status, title, reason, field)
        response.headers.update(HEADERS)
        route = request.match_info.route.resource
        PAGES.labels(route.canonical if route is not None else "unknown",
                     str(response.status)).inc()
        return response

    def error_page(self, request: web.Request, status: int, title: str, reason: str,
                   field: str = "") -> web.Response:
        return self.render(request, "error.html", {"status": status, "title": title,
                                                   "reason": reason, "field": field},
                           status)

    def classify(self, exc: BaseException) -> tuple[int, str, str, str]:
        """An exception as (HTTP status, title, reason, field) for the error page."""
        backend = self._backend
        resolved = self.resolved
        if isinstance(exc, PageError):
            return exc.status, exc.title, exc.reason, exc.field
        if isinstance(exc, ValidationError):
            return 400, "Bad request", exc.reason, exc.field
        if isinstance(exc, ShardUnavailable):
            return 503, "Consumer member unreachable", (
                f"{exc} (is a consumer member listening at {exc.address}? "
                f"--consumer.address came from {resolved.consumer.source})"), ""
        if isinstance(exc, Unavailable):
            return 503, "Broker unreachable", (
                f"{exc} (is a broker listening at {exc.address}? --broker.address came "
                f"from {resolved.broker.source})"), ""
        if isinstance(exc, EtcdError):
            return 503, "etcd unreachable", f"{exc}", ""
        if isinstance(exc, TimeoutError):
            return 504, "Timed out", (f"the page took longer than {self.config.timeout:g} "
                                      "s: a broker, member or etcd did not answer in time"), ""
        if isinstance(exc, BrokerError | ShardError):
            code = str(exc.status)
            if code in REFUSED:
                token = ("the console holds no token (give one with --auth.token or "
                         "$AUTH_TOKEN)" if backend is None or not self.config.auth_token
                         else "the console's token does not grant it")
                who = "consumer member" if isinstance(exc, ShardError) else "broker"
                return (401 if code == "UNAUTHENTICATED" else 403,
                        f"Refused by the {who}", f"{exc}: {token}", "")
            if exc.status in (Status.JOURNAL_NOT_FOUND, ShardStatus.SHARD_NOT_FOUND):
                return 404, "Not found", str(exc), ""
            return 502, "Refused", str(exc), ""
        if isinstance(exc, CommandError):
            return 400, "Bad request", str(exc), ""
        if isinstance(exc, GazetteError | OSError):
            return 500, "Error", str(exc), ""
        return 500, "Internal error", (f"the console failed ({type(exc).__name__}); its "
                                       "log has the details"), ""
