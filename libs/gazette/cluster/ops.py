"""The operational HTTP endpoints every member serves: ``GET /metrics`` (Prometheus) and
``GET /healthz`` (200 while the member serves, else 503, for probes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import prometheus_client
from aiohttp import web


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


def add_ops_routes(app: web.Application, ready: Callable[[], bool]) -> None:
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz(ready))
