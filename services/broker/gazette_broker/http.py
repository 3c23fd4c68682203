"""The HTTP gateway: journals over plain HTTP, as in the tutorial's ``curl`` commands.

- ``PUT /<journal>`` (or POST) appends the request body atomically: all of it or, if the
  client goes away before the body ends, none of it. Answers 204 with the commit in
  ``X-Gazette-Commit`` headers. A body of up to 8 MiB (with a Content-Length) that is
  refused while the journal's route changes (a broker failing over) is sent again for
  up to 20 s. A failed append says whether it wrote anything: 503 with ``Retry-After``
  and ``X-Gazette-Outcome: not-written`` (send it again), or 504 with
  ``X-Gazette-Outcome: unknown`` (it may or may not have been written).
- ``GET /<journal>?offset=N&block=true&end_offset=M`` streams content from `offset`
  (default 0; -1 is the write head) as it commits; without `block` it ends at the write
  head. A read that cannot start answers with a status and a one-line reason.
- ``GET /metrics`` (Prometheus) and ``GET /healthz`` (200 while serving, else 503).

With TLS (``--tls.cert-file``) the gateway serves HTTPS. With authorization on
(``--auth.keys-file``) every journal request needs ``Authorization: Bearer <token>``
granting ``append`` (PUT, POST) or ``read`` (GET) over the journal (its selector matched
against the journal's labels): 401 without a valid token, 403 with one that does not
grant the request, each with the reason. ``GET`` (and ``HEAD``) ``/metrics`` and
``/healthz`` stay open; any other method on those paths is a journal request like any
other (`gazette.cluster.http_app`).

Requests are routed as gRPC ones are (`gazette_broker.routing`): in a cluster, an append
to a journal this broker is not primary of, or a read of one it holds no replica of, is
forwarded to the broker that serves it over the broker's shared channels
(`gazette_broker.forward`), carrying the caller's token.

Errors map to statuses: unknown journal 404, bad parameters or names 400, append refused
by the journal (read-only) or read of a write-only one 403, a body that stalls 408, over
the size limit 413, wrong offset or registers 409, nothing at the offset yet 416, a
corrupt fragment 500, routing changes, a store outage or too much unpersisted data 503,
an append whose outcome is unknown 504. A blocking read of a journal that is deleted is
cut (its response never ends cleanly); one of a journal that moves to other brokers goes
on through them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from ssl import SSLContext

from aiohttp import web

from gazette import names
from gazette.auth import Authorizer, Caller, Capability
from gazette.client import AppendResult, AppendUncertain
from gazette.errors import ValidationError, short_repr
from gazette.fragment import CorruptFragment, JournalClosed, fragment_from_pb
from gazette.fragment.store import StoreError
from gazette.labels import EMPTY, journal_labels
from gazette.pb import broker_pb2 as pb
from gazette.protocol import JournalSpec, Status, labels_from_pb
from gazette.serving.http_listener import HttpRunner, http_app
from gazette_broker.errors import AppendStalled, StatusError
from gazette_broker.forward import ForwardFailed, forward_append
from gazette_broker.http_reads import read_chunks
from gazette_broker.routing import JournalRouting, JournalUnready

log = logging.getLogger(__name__)

#: HTTP codes of the protocol's refusals (any other: 500).
STATUS_CODES = {
    Status.JOURNAL_NOT_FOUND: 404,
    Status.NOT_ALLOWED: 403,
    Status.APPEND_TOO_LARGE: 413,
    Status.WRONG_APPEND_OFFSET: 409,
    Status.REGISTER_MISMATCH: 409,
    Status.OFFSET_NOT_YET_AVAILABLE: 416,
    Status.NOT_JOURNAL_BROKER: 503,
    Status.NO_JOURNAL_PRIMARY_BROKER: 503,
    Status.NOT_JOURNAL_PRIMARY_BROKER: 503,
    Status.INSUFFICIENT_JOURNAL_BROKERS: 503,
    Status.REPLICATION_FAILED: 503,
    Status.WRONG_ROUTE: 503,
    Status.FRAGMENT_STORE_UNHEALTHY: 503,
}
#: HTTP codes of a forward's gRPC failures (any other: 503, nothing was written).
FORWARD_CODES = {"UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "INVALID_ARGUMENT": 400,
                 "DATA_LOSS": 500}
#: Bytes of request body handed to the replica at once.
BODY_CHUNK = 256 << 10
#: Bodies up to this size are held, so that an append refused while its journal's route
#: changes is sent again (larger ones stream once).
REPLAY_BODY_BYTES = 8 << 20
#: How long such an append is tried again.
RETRY_SECONDS = 20.0
#: Offsets are int64.
MAX_OFFSET = (1 << 63) - 1
#: Answer header: whether a failed append wrote nothing ("not-written": send it again)
#: or may have ("unknown").
OUTCOME = "X-Gazette-Outcome"
NOT_WRITTEN = {OUTCOME: "not-written", "Retry-After": "1"}


class HttpError(web.HTTPException):
    """An error answer with a plain-text reason; `retry`: nothing was written and the
    same request may succeed in a moment (the journal's route is changing)."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None,
                 retry: bool = False) -> None:
        self.status_code = status
        self.retry = retry
        super().__init__(text=reason + "\n", content_type="text/plain", headers=headers)


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
        if not (raw.isascii() and raw.removeprefix("-").isdigit()):
            raise ValueError(raw)  # int() takes " 7", "+7", "1_0" and "\u0667" too
        value = int(raw)
    except ValueError:
        raise HttpError(400, f"{name}: expected an integer, got {short_repr(raw)}") from None
    if value < minimum:
        raise HttpError(400, f"{name}: must be at least {minimum}, got {value}")
    if value > MAX_OFFSET:
        raise HttpError(400, f"{name}: must be at most {MAX_OFFSET}, got {short_repr(raw)}")
    return value


def _bool_param(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw in ("", "1", "true", "yes"):
        return raw != ""
    if raw in ("0", "false", "no"):
        return False
    raise HttpError(400, f"{name}: expected true or false, got {raw!r}")


def refusal(err: StatusError | JournalUnready | ForwardFailed) -> HttpError:
    """The answer to a request the broker (this one or the one it went to) refused: for
    an append, nothing was written."""
    if isinstance(err, JournalUnready):
        return HttpError(503, err.reason, {OUTCOME: "not-written", "Retry-After": "5"},
                         retry=err.soon)
    if isinstance(err, ForwardFailed):
        code = FORWARD_CODES.get(err.code.name)
        if code is not None:
            return HttpError(code, str(err))
        return HttpError(503, f"{err}; nothing was written", NOT_WRITTEN, retry=True)
    status = err.status
    message = f"{status}: {err.message}"
    if status.retriable:
        return HttpError(503, f"{message}; nothing was written", NOT_WRITTEN,
                         retry=status.route_changing)
    return HttpError(STATUS_CODES.get(status, 500), message)


class HttpGateway:
    """Serves the journals `routing` routes over HTTP; `ready` tells ``/healthz``
    whether to pass."""

    def __init__(self, routing: JournalRouting,
                 ready: Callable[[], bool] = lambda: True, grace: float = 5.0,
                 content_type: Callable[[str], str] = lambda journal: "",
                 max_append_size: int = 0, authorizer: Authorizer | None = None,
                 spec_of: Callable[[str], JournalSpec | None] = lambda journal: None
                 ) -> None:
        """`content_type` of a journal by its spec's labels; `authorizer` checks
        callers' tokens (None: open), against the labels of `spec_of`."""
        self.routing = routing
        self.authorizer, self.spec_of = authorizer, spec_of
        self.content_type = content_type
        self.max_append_size = max_append_size
        self.ready = ready
        app = http_app(lambda: self.ready(), authorizer or Authorizer(None, {}),
                       self._authorize)
        # Any character (a newline too): a bad name is refused naming the field.
        app.router.add_route("PUT", "/{journal:[\\s\\S]+}", self._append)
        app.router.add_route("POST", "/{journal:[\\s\\S]+}", self._append)
        app.router.add_get("/{journal:[\\s\\S]+}", self._read)
        self._runner = HttpRunner(app, grace=grace, log_name=__name__)

    async def start(self, host: str | None, port: int, ssl: SSLContext | None = None
                    ) -> int:
        """Listen on `host`:`port` (port 0: a free one), over TLS with `ssl`; returns
        the port."""
        if host is None and port == 0:
            host = "0.0.0.0"
        return await self._runner.listen(host, port, ssl)

    async def stop(self) -> None:
        """Stop listening; requests in flight get `grace` seconds, then are cancelled."""
        await self._runner.cleanup()

    def _authorize(self, request: web.Request, caller: Caller) -> None:
        """The caller's token must grant the request over its journal (see module doc);
        one no route takes (a 404 or 405 to come) needs only a valid token."""
        if "journal" not in request.match_info:
            return
        journal = _journal(request)
        need = Capability.READ if request.method in ("GET", "HEAD") else Capability.APPEND
        caller.claims.require(need, f"{request.method} {journal}")
        if caller.claims.scoped:
            spec = self.spec_of(journal)
            caller.require_scope(journal_labels(
                journal, spec.labels if spec is not None else EMPTY), f"journal {journal}")

    async def _append(self, request: web.Request) -> web.Response:
        journal = _journal(request)
        replica = self.routing.replicas.get(journal)
        limit = replica.max_append_size if replica is not None else self.max_append_size
        size = request.content_length
        if size is not None and limit and size > limit:
            raise HttpError(413, f"append of {size} bytes is larger than the {limit}-byte "
                            "limit")
        if size is not None and size <= REPLAY_BODY_BYTES:
            # Small enough to hold: sent again while the journal's route settles.
            result, head = await self._append_retrying(journal, await request.read())
        else:
            result, head = await self._append_once(journal, request.content.iter_chunked(
                BODY_CHUNK))
        commit = result.commit
        return web.Response(status=204, headers={
            "X-Gazette-Commit": f"{commit.journal}:{commit.begin}-{commit.end}",
            "X-Gazette-Commit-Begin": str(commit.begin),
            "X-Gazette-Commit-End": str(commit.end),
            "X-Gazette-Commit-Sha1": commit.sha1.hex(),
            "X-Gazette-Write-Head": str(head),
        })

    async def _append_retrying(self, journal: str, body: bytes) -> tuple[AppendResult, int]:
        """`_append_once`, tried again (with backoff, for up to `RETRY_SECONDS`) while
        the answer is a routing status: nothing was written, the route is changing."""
        deadline = time.monotonic() + RETRY_SECONDS
        delay = 0.05
        while True:
            try:
                return await self._append_once(journal, _one(body))
            except HttpError as err:
                if not err.retry or time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 1.0)

    async def _append_once(self, journal: str, body: AsyncIterator[bytes]
                           ) -> tuple[AppendResult, int]:
        """One attempt: here if this broker is the journal's primary, else forwarded to
        it. `HttpError` says whether anything may have been written."""
        routing = self.routing
        try:
            routed = await routing.resolve(journal)
            target = routing.append_target(routed)
            if not isinstance(target, str):
                result = await target.append(body)
                return result, target.write_head
            assert routed.res is not None
            resp = await forward_append(routing.forwarding, target,
                                        pb.AppendRequest(journal=journal),
                                        routing.header(res=routed.res), body)
            status = Status.of(resp.status)
            if status is not Status.OK:
                raise StatusError(status, f"{journal}: {resp.detail}" if resp.detail
                                  else journal)
            result = AppendResult(fragment_from_pb(resp.commit),
                                  labels_from_pb(resp.registers, "registers"))
            return result, result.commit.end
        except ValidationError as err:
            raise HttpError(400, str(err)) from None
        except (StatusError, JournalUnready, ForwardFailed) as err:
            raise refusal(err) from None
        except AppendStalled as err:
            raise HttpError(408, f"REQUEST_TIMEOUT: {err}") from None
        except AppendUncertain as err:
            raise HttpError(504, f"APPEND_UNCERTAIN: {err}",
                            {OUTCOME: "unknown"}) from None

    async def _read(self, request: web.Request) -> web.StreamResponse:
        journal = _journal(request)
        offset = _int_param(request, "offset", 0, -1)
        end_offset = _int_param(request, "end_offset", 0, 0)
        block = _bool_param(request, "block")
        routing = self.routing
        try:
            routed = await routing.resolve(journal)
            target = routing.read_target(routed)
        except ValidationError as err:
            raise HttpError(400, str(err)) from None
        except (StatusError, JournalUnready) as err:
            raise refusal(err) from None
        if isinstance(target, str):
            content_type, headers = self.content_type(journal), {}
        else:
            content_type = (target.spec.labels.values("content-type") or ("",))[0]
            headers = {"X-Gazette-Write-Head": str(target.write_head)}
        response = web.StreamResponse(headers={
            "Content-Type": content_type or "application/octet-stream", **headers})
        chunks = read_chunks(routing, routed, target, offset, block, end_offset)
        try:
            if not block:  # a read that cannot start gets a status, not an empty 200
                first = await anext(chunks, None)
                if first is None and isinstance(target, str):
                    raise HttpError(416, f"OFFSET_NOT_YET_AVAILABLE: nothing to read at "
                                    f"offset {offset} of {journal} yet")
                if first is not None:
                    response.headers["X-Gazette-Write-Head"] = str(first.write_head)
                    response.headers["X-Gazette-Offset"] = str(first.offset)
                    response.headers["X-Gazette-Fragment"] = first.fragment.path
                await response.prepare(request)
                if first is not None:
                    await response.write(first.content)
            else:
                await response.prepare(request)
            async for chunk in chunks:
                await response.write(chunk.content)
        except JournalClosed as err:  # deleted: the connection is cut
            if response.prepared:
                log.info("HTTP read of %s ended: %s", journal, err)
                if request.transport is not None:
                    request.transport.abort()
                return response
            raise HttpError(404, f"JOURNAL_NOT_FOUND: {journal}") from None
        except (StatusError, ForwardFailed, JournalUnready) as err:
            if response.prepared:
                raise  # the connection is cut: the reader sees a truncated body
            raise refusal(err) from None
        except CorruptFragment as err:  # undecodable ones too (the cache's FragmentDecoder)
            log.error("HTTP read of %s: %s", journal, err)
            if response.prepared:
                raise
            raise HttpError(500, f"DATA_LOSS: {err}") from None
        except StoreError as err:
            if response.prepared:
                raise
            raise HttpError(503, f"store unavailable: {err}") from None
        except ConnectionResetError:
            return response  # the reader went away: nothing more to write, not even EOF
        finally:
            await chunks.aclose()
        await response.write_eof()
        return response


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data
