"""The HTTP gateway: journals over plain HTTP, as in the tutorial's ``curl`` commands.

- ``PUT /<journal>`` (or POST) appends the request body atomically: all of it or, if the
  client goes away before the body ends, none of it. Answers 204 with the commit in
  ``X-Gazette-Commit`` headers.
- ``GET /<journal>?offset=N&block=true&end_offset=M`` streams content from `offset`
  (default 0; -1 is the write head) as it commits; without `block` it ends at the write
  head. A read that cannot start answers with a status and a one-line reason.
- ``GET /metrics`` (Prometheus) and ``GET /healthz`` (200 while serving, else 503).

In a cluster, a journal this broker is not primary of (appends) or holds no replica of
(reads) goes through `forward`, a client of this broker's own gRPC service, which
routes it to the broker that serves it.

Errors map to statuses: unknown journal 404, bad parameters or names 400, append refused
by the journal (read-only) 403, over the size limit 413, wrong offset or registers 409,
nothing at the offset yet 416, a corrupt fragment 500, a store outage 503.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import prometheus_client
from aiohttp import web

from gazette import names
from gazette.client import JournalClient, ReadChunk
from gazette.client.errors import AppendUncertain, BrokerError, Unavailable
from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment
from gazette.fragment.store import StoreError
from gazette_broker.replica import AppendError, ReadError, Replica

log = logging.getLogger(__name__)

STATUS_CODES = {
    "JOURNAL_NOT_FOUND": 404,
    "INVALID_OFFSET": 400,
    "NOT_ALLOWED": 403,
    "WRONG_APPEND_OFFSET": 409,
    "REGISTER_MISMATCH": 409,
    "OFFSET_NOT_YET_AVAILABLE": 416,
    "NOT_JOURNAL_BROKER": 503,
    "NO_JOURNAL_PRIMARY_BROKER": 503,
    "NOT_JOURNAL_PRIMARY_BROKER": 503,
    "INSUFFICIENT_JOURNAL_BROKERS": 503,
    "REPLICATION_FAILED": 503,
    "WRONG_ROUTE": 503,
}
#: Bytes of request body handed to the replica at once.
BODY_CHUNK = 256 << 10


class HttpError(web.HTTPException):
    """An error answer with a plain-text reason."""

    def __init__(self, status: int, reason: str) -> None:
        self.status_code = status
        super().__init__(text=reason + "\n", content_type="text/plain")


def _error_for(status: str, message: str) -> HttpError:
    return HttpError(STATUS_CODES.get(status, 500), message)


def _journal(request: web.Request) -> str:
    journal = request.match_info["journal"]
    try:
        names.validate_journal_name(journal, "journal")
    except ValidationError as err:
        raise HttpError(400, str(err)) from None
    return journal


def _int_param(request: web.Request, name: str, default: int, minimum: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(400, f"{name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise HttpError(400, f"{name}: must be at least {minimum}, got {value}")
    return value


def _bool_param(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw in ("", "1", "true", "yes"):
        return raw != ""
    if raw in ("0", "false", "no"):
        return False
    raise HttpError(400, f"{name}: expected true or false, got {raw!r}")


class HttpGateway:
    """Serves `replicas` over HTTP; `ready` tells ``/healthz`` whether to pass."""

    def __init__(self, replicas: Mapping[str, Replica],
                 ready: Callable[[], bool] = lambda: True, grace: float = 5.0,
                 unready: Mapping[str, str] | None = None,
                 forward: JournalClient | None = None,
                 content_type: Callable[[str], str] = lambda journal: "",
                 max_append_size: int = 0) -> None:
        """`forward`: a client of this broker's gRPC service, for journals served
        elsewhere; `content_type` of a journal by its spec's labels."""
        self.replicas = replicas
        self.forward, self.content_type = forward, content_type
        self.max_append_size = max_append_size
        #: Journals with a spec that cannot be served yet, and why (503).
        self.unready: Mapping[str, str] = unready if unready is not None else {}
        self.ready = ready
        app = web.Application(client_max_size=1 << 20)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_route("PUT", "/{journal:.+}", self._append)
        app.router.add_route("POST", "/{journal:.+}", self._append)
        app.router.add_get("/{journal:.+}", self._read)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=grace)
        self._site: web.TCPSite | None = None

    async def start(self, host: str | None, port: int) -> int:
        """Listen on `host`:`port` (port 0: a free one); returns the port."""
        await self._runner.setup()
        if host is None and port == 0:
            host = "0.0.0.0"
        self._site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await self._site.start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop listening; requests in flight get `grace` seconds, then are cancelled."""
        await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        body = prometheus_client.generate_latest(prometheus_client.REGISTRY)
        return web.Response(body=body,
                            headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        if self.ready():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not serving\n")

    def _forwarded(self, request: web.Request, primary: bool) -> str:
        """The journal of `request` if it goes through `forward` (this broker is not its
        primary, for an append, or holds no replica of it); "" if served here."""
        journal = _journal(request)
        replica = self.replicas.get(journal)
        if self.forward is None or journal in self.unready or (
                replica is not None and (replica.is_primary or not primary)):
            return ""
        return journal

    def _replica(self, request: web.Request) -> Replica:
        journal = _journal(request)
        replica = self.replicas.get(journal)
        if replica is None and journal in self.unready:
            raise HttpError(503, self.unready[journal])
        if replica is None:
            raise HttpError(404, f"JOURNAL_NOT_FOUND: {journal}")
        return replica

    async def _append(self, request: web.Request) -> web.Response:
        forwarded = self._forwarded(request, primary=True)
        replica = None if forwarded else self._replica(request)
        limit = replica.max_append_size if replica is not None else self.max_append_size
        if request.content_length is not None and limit and request.content_length > limit:
            raise HttpError(413, f"append of {request.content_length} bytes is larger than "
                            f"the {limit}-byte limit")
        body_ended = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal body_ended
            async for chunk in request.content.iter_chunked(BODY_CHUNK):
                yield chunk
            body_ended = True

        try:
            if replica is not None:
                result: Any = await replica.append(body())
                head = replica.write_head
            else:
                assert self.forward is not None
                result = await self.forward.append(forwarded, body())
                head = result.commit.end
        except AppendError as err:
            if "limit" in str(err):
                raise HttpError(413, str(err)) from None
            raise _error_for(err.status, str(err)) from None
        except BrokerError as err:
            raise _error_for(err.status, f"{err.status}: {forwarded}") from None
        except (AppendUncertain, Unavailable) as err:
            raise HttpError(503, str(err)) from None
        if not body_ended:  # pragma: no cover - append consumes the whole body
            raise HttpError(400, "the request body did not end")
        commit = result.commit
        return web.Response(status=204, headers={
            "X-Gazette-Commit": f"{commit.journal}:{commit.begin}-{commit.end}",
            "X-Gazette-Commit-Begin": str(commit.begin),
            "X-Gazette-Commit-End": str(commit.end),
            "X-Gazette-Commit-Sha1": commit.sha1.hex(),
            "X-Gazette-Write-Head": str(head),
        })

    async def _read(self, request: web.Request) -> web.StreamResponse:
        forwarded = self._forwarded(request, primary=False)
        replica = None if forwarded else self._replica(request)
        offset = _int_param(request, "offset", 0, -1)
        end_offset = _int_param(request, "end_offset", 0, 0)
        block = _bool_param(request, "block")
        chunks: Any
        if replica is not None:
            chunks = replica.read(offset, block=block, end_offset=end_offset)
            content_type = (replica.spec.labels.values("content-type") or ("",))[0]
            headers = {"X-Gazette-Write-Head": str(replica.write_head)}
        else:
            assert self.forward is not None
            chunks = self.forward.read(forwarded, offset, block=block, end_offset=end_offset)
            content_type, headers = self.content_type(forwarded), {}
        response = web.StreamResponse(headers={
            "Content-Type": content_type or "application/octet-stream", **headers})
        try:
            first: ReadChunk | None = None
            if not block:  # a read that cannot start gets a status, not an empty 200
                first = await anext(chunks, None)
                if first is None and replica is None:
                    raise HttpError(416, f"OFFSET_NOT_YET_AVAILABLE: nothing to read at "
                                    f"offset {offset} of {forwarded} yet")
                if first is not None:
                    response.headers["X-Gazette-Write-Head"] = str(first.write_head)
                    response.headers["X-Gazette-Offset"] = str(first.offset)
                    response.headers["X-Gazette-Fragment"] = first.fragment.path
            await response.prepare(request)
            if first is not None:
                await response.write(first.content)
            async for chunk in chunks:
                await response.write(chunk.content)
        except ReadError as err:
            if response.prepared:  # pragma: no cover - raised only before any content
                raise
            raise _error_for(err.status, str(err)) from None
        except BrokerError as err:
            if response.prepared:
                raise
            raise _error_for(err.status, f"{err.status}: {forwarded}") from None
        except Unavailable as err:
            if response.prepared:
                raise
            raise HttpError(503, str(err)) from None
        except CorruptFragment as err:  # undecodable ones too (the cache's FragmentDecoder)
            log.error("HTTP read of %s: %s", forwarded or _journal(request), err)
            if response.prepared:
                raise  # the connection is cut: the reader sees a truncated body
            raise HttpError(500, f"DATA_LOSS: {err}") from None
        except StoreError as err:
            if response.prepared:
                raise
            raise HttpError(503, f"store unavailable: {err}") from None
        except ConnectionResetError:
            return response  # the reader went away: nothing more to write, not even EOF
        finally:
            await chunks.aclose()
        if response.prepared:
            await response.write_eof()
        return response
