"""Who gets in, and what a connection may hold, at a consumer member's wire edges
(issue 34; the member is `tests.fixtures.member_wire`'s, authorization on):

4. header floods: gRPC metadata (through grpc and raw HTTP/2) and HTTP/1.1 requests with
   thousands of headers, a huge one, a huge request line;
5. slow-loris and silent HTTP connections;
6. tokens on every route: none, malformed, expired, wrongly signed, ``alg: none``,
   lacking the route's capability, limited to another shard, and valid, on every gRPC
   method and HTTP route (the open ones too, with every method).

Each case prints ``fuzz member-<case>: N inputs, M served wrongly`` and ends as
`test_fuzz_member.py`'s do. Served wrongly: an answer other than the route's for that
token (anything granted that should not be), a connection kept past the idle timeout,
memory over a ceiling.

Found and fixed (`test_consumer_security.py`): an application's HTTP routes on the
shard's primary were answered from its live store without a token (and, outside a gRPC
call, its caller was taken for unrestricted).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import time
from collections.abc import Callable

import aiohttp
import grpc
import pytest

from gazette.auth import Capability
from gazette.pb import consumer_pb2 as cpb
from gazette.protocol import ShardSource, ShardSpec, shard_spec_to_pb
from gazette.serving.http_listener import IDLE_TIMEOUT
from tests.fixtures.consumer import SHARDS
from tests.fixtures.fuzz import (
    DEADLINE,
    FLOODS,
    counts,
    cut_after,
    http_floods,
    raw_http,
)
from tests.fixtures.member_app import PROBE, TOTAL_PATH
from tests.fixtures.member_wire import (
    KEY,
    MAX_GROWTH_MIB,
    METHODS,
    SHARD,
    admin,
    assert_member_serving,
    bearer,
    call,
    case,
    total_request,
)
from tests.fixtures.security import random_key, token
from tests.fixtures.wire import (
    MemberProcess,
    RawH2,
    grpc_prefix,
)

pytestmark = pytest.mark.integration


# -- 4. header floods ---------------------------------------------------------------------


async def test_header_floods(fuzzed_member: MemberProcess, report: Callable[..., None]) -> None:
    wrong: list[str] = []
    statuses: collections.Counter[str] = collections.Counter()
    inputs = 0
    echo = cpb.StatRequest(shard="shard-0").SerializeToString()
    async with case(fuzzed_member) as info:
        # Through grpc, and raw HTTP/2 once the SETTINGS are acknowledged: refused.
        async with grpc.aio.insecure_channel(fuzzed_member.grpc_address) as channel:
            for what, flood in FLOODS.items():
                inputs += 1
                metadata = (*bearer(), *((k.decode(), v.decode()) for k, v in flood))
                code, _ = await call(channel, "Echo", [echo], DEADLINE, metadata)
                statuses[f"grpc {code}"] += 1
                if code != "RESOURCE_EXHAUSTED":
                    wrong.append(f"grpc metadata, {what}: {code}")
        for what, flood in FLOODS.items():
            h2c = await RawH2.connect("127.0.0.1", fuzzed_member.grpc_port)
            try:
                sid = h2c.request(METHODS["Echo"][0], flood)
                h2c.send(sid, grpc_prefix(len(echo)) + echo, end_stream=True)
                await h2c.flush()
                out = await h2c.outcome(sid, DEADLINE)
                inputs += 1
                statuses[f"h2 {str(out).split(' ')[0]}"] += 1
                if not out.refused:
                    wrong.append(f"raw HTTP/2, {what}: {out}")
            finally:
                await h2c.close()
        # HTTP/1.1, to an application route and to a probe: 400 or 431, many at once.
        floods = http_floods(b"/sums/k?shard=shard-0") + http_floods(b"/healthz")
        lines = await asyncio.gather(*(raw_http(fuzzed_member.http_port, r) for r in floods * 8))
        inputs += len(lines)
        for line in lines:
            statuses[f"http {line[9:12].decode() or 'closed'}"] += 1
            if line and line[9:12] not in (b"400", b"431"):
                wrong.append(f"HTTP header flood: {line!r}")
        growth = fuzzed_member.rss_mib() - info["rss"]
    report("member-header-flood", inputs, len(wrong),
           f"{counts(statuses)}; growth {growth:.0f} MiB; "
           f"{time.monotonic() - info['start']:.1f}s")
    assert not wrong, "\n".join(wrong)
    assert growth < MAX_GROWTH_MIB


# -- 5. slow loris ------------------------------------------------------------------------


SLOW_CLIENTS = 20
SILENT_CLIENTS = 20


async def test_slow_loris_and_silent_connections_are_cut(
        fuzzed_member: MemberProcess, report: Callable[..., None]) -> None:
    limit = IDLE_TIMEOUT + 5
    async with case(fuzzed_member) as info:
        conns = [await asyncio.open_connection("127.0.0.1", fuzzed_member.http_port)
                 for _ in range(SLOW_CLIENTS + SILENT_CLIENTS)]
        drip = (b"GET /sums/k?shard=shard-0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + admin().encode() + b"\r\nX-Slow: " + b"s" * 4096)
        waiting = [asyncio.ensure_future(cut_after(r, w, drip if i < SLOW_CLIENTS else None,
                                                   limit))
                   for i, (r, w) in enumerate(conns)]
        served = []  # meanwhile, other clients are served as usual
        while not all(w.done() for w in waiting):
            served.append(await assert_member_serving(fuzzed_member))
            await asyncio.wait(waiting, timeout=1.0)
        cut = [w.result() for w in waiting]
        for _, writer in conns:
            writer.close()
    never = sum(c is None for c in cut)
    report("member-slow-loris", len(conns), never,
           f"{SLOW_CLIENTS} slow-loris and {SILENT_CLIENTS} silent connections: "
           f"{len(cut) - never} cut after at most "
           f"{max((c for c in cut if c is not None), default=0.0):.1f}s; {len(served)} "
           f"normal calls meanwhile, the slowest {max(served):.2f}s; "
           f"{time.monotonic() - info['start']:.1f}s")
    assert never == 0, f"{never} connections were still open after {limit:.0f}s"
    assert max(served) < DEADLINE / 2


# -- 6. tokens on every route -------------------------------------------------------------


def _b64(doc: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def _unauthenticated() -> dict[str, str | None]:
    """Authorization values that authenticate no one (None: no header)."""
    now = time.time()
    return {
        "no token": None,
        "no bearer token": "Bearer",
        "basic": "Basic YWRtaW46YWRtaW4=",
        "not a JWT": "Bearer not.a.jwt",
        "expired": "Bearer " + token(KEY, *Capability, ttl=60, now=now - 3600),
        "wrongly signed": "Bearer " + token(random_key(), *Capability),
        "alg none": "Bearer " + _b64({"alg": "none", "typ": "JWT"}) + "." + _b64(
            {"sub": "x", "cap": [c.value for c in Capability], "exp": now + 600}) + ".",
    }


#: The kinds of token `_unauthenticated` makes.
UNAUTHENTICATED = frozenset(_unauthenticated())


def _lacking(need: Capability) -> str:
    return "Bearer " + token(KEY, *(c for c in Capability if c is not need),
                             subject=f"no-{need.value}")


def _grpc_routes() -> dict[str, tuple[str, bytes, bool, Capability | None, bool]]:
    """Name: (path, request, client-streaming, capability needed, reaches shard-0)."""
    spec = shard_spec_to_pb(ShardSpec("shard-0", (ShardSource("counts/in-0"),)))
    stat = cpb.StatRequest(shard="shard-0").SerializeToString()
    return {
        "Stat": (SHARD + "Stat", stat, False, Capability.SHARD_READ, True),
        "GetHints": (SHARD + "GetHints", cpb.GetHintsRequest(shard="shard-0")
                     .SerializeToString(), False, Capability.SHARD_READ, True),
        "List": (SHARD + "List", cpb.ListRequest().SerializeToString(), False,
                 Capability.SHARD_LIST, False),
        # Revision 1 is long gone: a grant changes nothing (ETCD_TRANSACTION_FAILED).
        "Apply": (SHARD + "Apply", cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(
            upsert=spec, expect_mod_revision=1)]).SerializeToString(), False,
                  Capability.SHARD_APPLY, True),
        "Unassign": (SHARD + "Unassign", cpb.UnassignRequest(
            shards=["shard-0"], dry_run=True).SerializeToString(), False,
                     Capability.SHARD_APPLY, True),
        "Total": (TOTAL_PATH, total_request("shard-0"), False, Capability.SHARD_CALL, True),
        "Echo": (f"/{PROBE}/Echo", stat, False, Capability.SHARD_CALL, False),
        "Gather": (f"/{PROBE}/Gather", stat, True, Capability.SHARD_CALL, False),
        "Check": ("/grpc.health.v1.Health/Check", b"", False, None, False),
    }


#: (method, path, body, what it is): an application route, an open one, or another.
HTTP_ROUTES: list[tuple[str, str, bytes, str]] = [
    ("GET", "/sums/k?shard=shard-0", b"", "app"),
    ("POST", "/sums", total_request("shard-0"), "app"),
    *((m, p, b"", "open") for m in ("GET", "HEAD") for p in ("/healthz", "/metrics")),
    *((m, p, b"x", "405") for m in ("PUT", "POST", "DELETE") for p in ("/healthz",
                                                                       "/metrics")),
    ("DELETE", "/sums/k", b"", "405"), ("PUT", "/sums", b"{}", "405"),
    ("GET", "/nope", b"", "404"), ("GET", "/sums/k/more", b"", "404"),
]


def _tokens(need: Capability | None) -> dict[str, str | None]:
    out = _unauthenticated()
    if need is not None:
        out["lacking " + need.value] = _lacking(need)
    out["other shard"] = "Bearer " + token(KEY, *Capability, selector="id=shard-1",
                                           subject="other-shard")
    out["valid"] = f"Bearer {admin()}"
    return out


def _grpc_expected(need: Capability | None, shard_0: bool, kind: str) -> str:
    if need is None or kind == "valid":
        return "OK"
    if kind in UNAUTHENTICATED:
        return "UNAUTHENTICATED"
    if kind.startswith("lacking") or shard_0:
        return "PERMISSION_DENIED"
    return "OK"


def _http_expected(what: str, kind: str) -> int:
    if what == "open":
        return 200
    if kind in UNAUTHENTICATED:
        return 401
    if kind.startswith("lacking") or (what == "app" and kind == "other shard"):
        return 403
    return 200 if what == "app" else int(what)


async def test_tokens_on_every_route(fuzzed_member: MemberProcess,
                                     report: Callable[..., None]) -> None:
    wrong: list[str] = []
    seen: collections.Counter[str] = collections.Counter()
    inputs = 0
    async with case(fuzzed_member) as info, \
            grpc.aio.insecure_channel(fuzzed_member.grpc_address) as channel, \
            aiohttp.ClientSession() as http:
        for name, (path, request, streaming, need, shard_0) in _grpc_routes().items():
            for kind, value in _tokens(need).items():
                metadata = () if value is None else (("authorization", value),)
                try:
                    if streaming:
                        answer = await channel.stream_unary(path)(iter([request]),
                                                                  timeout=DEADLINE,
                                                                  metadata=metadata)
                    else:
                        answer = await channel.unary_unary(path)(request, timeout=DEADLINE,
                                                                 metadata=metadata)
                    code = "OK"
                except grpc.aio.AioRpcError as err:
                    code = err.code().name
                inputs += 1
                seen[f"grpc {code}"] += 1
                expected = _grpc_expected(need, shard_0, kind)
                if code != expected:
                    wrong.append(f"gRPC {name} with {kind}: {code}, expected {expected}")
                elif name == "List" and code == "OK":  # a token lists what it covers
                    listed = [s.spec.id for s in cpb.ListResponse.FromString(answer).shards]
                    if listed != (["shard-1"] if kind == "other shard" else SHARDS):
                        wrong.append(f"gRPC List with {kind}: listed {listed}")
        for method, path, body, what in HTTP_ROUTES:
            for kind, value in _tokens(Capability.SHARD_CALL).items():
                headers = {} if value is None else {"Authorization": value}
                async with http.request(method, fuzzed_member.http_url + path, data=body or None,
                                        headers=headers) as r:
                    got, text = r.status, await r.text()
                    challenge = r.headers.get("WWW-Authenticate", "")
                inputs += 1
                seen[f"http {got}"] += 1
                expected = _http_expected(what, kind)
                if got != expected or (got == 401 and not challenge.startswith("Bearer")):
                    wrong.append(f"HTTP {method} {path} with {kind}: {got} {text[:120]!r}, "
                                 f"expected {expected}")
        elapsed = time.monotonic() - info["start"]
    report("member-tokens", inputs, len(wrong), f"{counts(seen)}; {elapsed:.1f}s")
    assert not wrong, "\n".join(wrong)
