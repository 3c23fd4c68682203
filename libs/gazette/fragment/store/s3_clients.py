"""The S3 clients of `S3Store`s, made through aiobotocore from `ClientSettings`.

An aiobotocore client owns a pool of HTTP connections and is bound to the event
loop it was made on, so clients are shared per event loop by every store with the same
client settings (endpoint, region, profile, credentials, timeouts): a broker with
hundreds of journals in one bucket, under different prefixes, keeps one connection pool.
A store takes a reference to its client on first use and drops it on `S3Store.close`; the
last reference closes the client. `aclose_all` closes every client of the running loop at
once (stores then reconnect if used again).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import botocore.exceptions
import botocore.loaders
from aiobotocore.session import AioSession
from botocore.config import Config


@dataclass(frozen=True)
class ClientSettings:
    """Everything an S3 client is made from: stores with equal settings share one."""

    endpoint: str | None
    region: str | None
    profile: str | None
    addressing_style: str | None
    connect_timeout: float
    read_timeout: float
    max_attempts: int
    max_connections: int
    config_file: str | None = None
    credentials_file: str | None = None
    #: (access key id, secret, session token) given explicitly, or None for the chain.
    credentials: tuple[str, str, str | None] | None = field(default=None, repr=False)

    def config(self) -> Config:
        return Config(
            signature_version="s3v4",
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retries={"total_max_attempts": self.max_attempts, "mode": "standard"},
            max_pool_connections=self.max_connections,
            s3={"addressing_style": self.addressing_style} if self.addressing_style else None,
        )


_loader: botocore.loaders.Loader | None = None
_loader_lock = threading.Lock()


def _warm_loader() -> botocore.loaders.Loader:
    """A botocore data loader with everything an S3 client needs already read (service
    model, endpoint rules, partitions: tens of milliseconds of file reads and JSON
    parsing), shared by every client of the process. Runs in a worker thread."""
    global _loader
    with _loader_lock:
        if _loader is None:
            loader = botocore.loaders.create_loader()
            # What making an S3 client and a paginator loads (keyed as the client asks).
            with contextlib.suppress(botocore.exceptions.DataNotFoundError):
                for name in ("sdk-default-configuration", "partitions", "_retry"):
                    loader.load_data(name)
                loader.load_service_model("s3", "service-2")
                loader.load_service_model("s3", "endpoint-rule-set-1")
                api_version = loader.determine_latest_version("s3", "service-2")
                loader.load_service_model("s3", "paginators-1", api_version)
            _loader = loader
        return _loader


def _no_expect_continue(request: Any, **_: Any) -> None:
    """Drop ``Expect: 100-continue``: aiohttp waits for the ``100 Continue`` of a frozen
    server with no read timeout at all, so a put would hang until the store's
    `op_timeout`."""
    if "Expect" in request.headers:
        del request.headers["Expect"]


class PooledClient:
    """One shared aiobotocore client: its settings, users and lifetime."""

    def __init__(self, pool: S3ClientPool, settings: ClientSettings,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.pool, self.settings, self.loop = pool, settings, loop
        self.refs = 0
        self.closed = False
        self.client: Any = None
        self._context: Any = None
        self.ready: asyncio.Future[None] = loop.create_future()
        self.opening: asyncio.Future[None] | None = None  # (a task needs a reference)

    async def open(self) -> None:
        s = self.settings
        loader = await asyncio.to_thread(_warm_loader)
        session = AioSession(profile=s.profile)
        session.register_component("data_loader", loader)
        if s.config_file:
            session.set_config_variable("config_file", s.config_file)
        if s.credentials_file:
            session.set_config_variable("credentials_file", s.credentials_file)
        creds: dict[str, str] = {}
        if s.credentials is not None:
            creds = {"aws_access_key_id": s.credentials[0],
                     "aws_secret_access_key": s.credentials[1]}
            if s.credentials[2]:
                creds["aws_session_token"] = s.credentials[2]
        context = session.create_client("s3", region_name=s.region, endpoint_url=s.endpoint,
                                        config=s.config(), **creds)
        client = await context.__aenter__()
        client.meta.events.register("before-send.s3", _no_expect_continue)
        self.client, self._context = client, context

    async def aclose(self) -> None:
        self.closed = True
        context, self._context, self.client = self._context, None, None
        if context is not None:
            await context.__aexit__(None, None, None)


class S3ClientPool:
    """The S3 clients of one event loop, one per distinct `ClientSettings`, counted by
    the stores that use them. Use `client_pool()` for the running loop's pool."""

    def __init__(self) -> None:
        self._clients: dict[ClientSettings, PooledClient] = {}

    def __len__(self) -> int:
        """How many clients are open (or opening)."""
        return len(self._clients)

    async def acquire(self, settings: ClientSettings) -> PooledClient:
        """A reference to the client for `settings`, opened if need be (concurrent
        callers share one opening; a failed opening is retried by the next call)."""
        while True:
            entry = self._clients.get(settings)
            if entry is None:
                entry = PooledClient(self, settings, asyncio.get_running_loop())
                self._clients[settings] = entry
                entry.opening = asyncio.ensure_future(entry.open())
                entry.opening.add_done_callback(functools.partial(self._opened, entry))
            await asyncio.shield(entry.ready)
            if not entry.closed:
                entry.refs += 1
                return entry

    def _opened(self, entry: PooledClient, task: asyncio.Future[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if task.cancelled() or exc is not None:
            if self._clients.get(entry.settings) is entry:
                del self._clients[entry.settings]
            entry.closed = True
            if exc is None:
                entry.ready.cancel()
            else:
                entry.ready.set_exception(exc)
                entry.ready.exception()  # retrieved: waiters, if any, re-raise it
        else:
            entry.ready.set_result(None)

    async def release(self, entry: PooledClient) -> None:
        """Drop a reference from `acquire`; the last one closes the client."""
        entry.refs -= 1
        if entry.refs <= 0 and not entry.closed:
            await self._close(entry)

    async def _close(self, entry: PooledClient) -> None:
        if self._clients.get(entry.settings) is entry:
            del self._clients[entry.settings]
        await entry.aclose()

    async def aclose(self) -> None:
        """Close every client (waiting for those being opened), whoever uses them."""
        entries = list(self._clients.values())
        await asyncio.gather(*(e.ready for e in entries), return_exceptions=True)
        for entry in entries:
            if not entry.closed:
                await self._close(entry)


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, S3ClientPool] = (
    weakref.WeakKeyDictionary())


def client_pool() -> S3ClientPool:
    """The S3 client pool of the running event loop."""
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = S3ClientPool()
    return pool


async def aclose_all() -> None:
    """Close every S3 client of the running event loop (e.g. at shutdown, after the
    stores are done): stores still in use reconnect."""
    pool = _POOLS.get(asyncio.get_running_loop())
    if pool is not None:
        await pool.aclose()
