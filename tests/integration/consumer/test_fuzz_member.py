"""Hostile input at a consumer member's wire edges (issue 34), as `test_fuzz_wire.py` is
for brokers: a member process (`tests.fixtures.member_wire`: ``gazette-consumer serve``
of `tests.fixtures.member_app.RoutedSums`, authorization on, four running shards) over a
broker process, against

1. malformed protobuf and JSON: random bytes and mutated valid requests to the
   application's own methods (a protobuf service it registered and a JSON shard
   method), the health service and the Shard service's read methods, and JSON no
   parser should choke on (deep nesting, huge numbers, invalid UTF-8);
2. gRPC messages whose length prefix lies or is huge, over raw HTTP/2, with a token and
   without;
3. invalid UTF-8 and odd Unicode in shard ids (gRPC fields, JSON, HTTP parameters) and
   in HTTP paths.

Header floods, slow-loris connections and tokens on every route are
`test_fuzz_member_access.py`'s. Each case prints ``fuzz member-<case>: N inputs, M
served wrongly`` and ends by checking that the member is alive, logged no traceback,
and answers a normal call over gRPC and HTTP. Served wrongly: UNKNOWN or INTERNAL (a
handler's exception), no answer where none should wait, a refusal that names no field
or differs from the library's own validation, memory over a ceiling.

Found and fixed (each with a test of its own, `test_consumer_service.py`): an
application's gRPC services and the health service were not behind the
malformed-request guard (UNKNOWN, a traceback logged per request); a shard method's
request that its ``shard_of`` could not read (deeply nested JSON: RecursionError) was
UNKNOWN, and one whose stream held no message was never answered.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2
from yarl import URL

from gazette import names
from gazette.errors import ValidationError
from gazette.pb import broker_pb2 as bpb
from gazette.pb import consumer_pb2 as cpb
from tests.fixtures.fuzz import (
    BAD_UTF8,
    DEADLINE,
    ODD,
    answers,
    bad_bytes,
    counts,
    expected_refusal,
    hypothesis_examples,
    ld,
    mutate,
    odd_text,
    raw_http,
)
from tests.fixtures.member_wire import (
    MAX_GROWTH_MIB,
    METHODS,
    admin,
    call,
    case,
    total_request,
)
from tests.fixtures.wire import (
    MemberProcess,
    RawH2,
    grpc_prefix,
)

pytestmark = pytest.mark.integration

INPUTS_PER_METHOD = 200
#: How long a request that may rightly wait (a Stat reading through offsets) is given.
WAITING_DEADLINE = 1.0



# -- 1. malformed protobuf and JSON -------------------------------------------------------


def _seeds() -> dict[str, list[list[bytes]]]:
    def one(*msgs: Any) -> list[bytes]:
        return [m.SerializeToString() for m in msgs]

    header = bpb.Header(route=bpb.Route(members=[bpb.ProcessSpec.ID(zone="z", suffix="m")],
                                        primary=0, endpoints=["http://127.0.0.1:1"]),
                        etcd=bpb.Header.Etcd(revision=1))
    label = bpb.LabelSet(labels=[bpb.Label(name="id", value="shard-0")])
    return {
        "Echo": [one(cpb.StatRequest(shard="shard-0")),
                 one(cpb.StatRequest(shard="a/b", read_through={"j": 5}, header=header))],
        "Gather": [one(cpb.StatRequest(read_through={"a": 1}), cpb.StatRequest(shard="s")),
                   one(cpb.StatRequest(read_through={"b": 2, "c": 3}))],
        "Total": [[total_request("shard-0")],
                  [b'{"shard": "shard-1", "key": "\\u00e9", "x": [1, 2.5, {"y": null}]}']],
        "Check": [one(health_pb2.HealthCheckRequest()),
                  one(health_pb2.HealthCheckRequest(service="gazette.consumer.Shard"))],
        "Stat": [one(cpb.StatRequest(shard="shard-1")),
                 one(cpb.StatRequest(shard="shard-2", read_through={"counts/in-2": 0}))],
        "GetHints": [one(cpb.GetHintsRequest(shard="shard-3", header=header))],
        "List": [one(cpb.ListRequest(selector=bpb.LabelSelector(include=label)))],
    }


#: JSON (or not) that a careless parser chokes on.
HOSTILE_JSON = [
    b"[" * 100_000, b'{"a": ' * 50_000, b"9" * 5000, b'{"shard": ' + b"9" * 5000 + b"}",
    b"NaN", b'{"shard": NaN, "key": Infinity}', b"\xff\xfe{}", b'{"shard": "\xff"}',
    b'\xef\xbb\xbf{"shard": "shard-0", "key": "k"}', b'{"shard": "shard-0", "key": "k"',
    b'{"shard": ["shard-0"], "key": "k"}', b'{"shard": null}', b'"shard-0"', b"[]",
    b"null", b"", b'{"shard": "' + b"a" * 100_000 + b'", "key": "k"}',
    b'{"shard": "shard-0", "key": "\\ud800"}', b'{"shard": "shard-0", "key": 1e999}',
    json.dumps({f"k{i}": i for i in range(20_000)}).encode(),
    b'{"shard": "shard-0", "shard": "shard-9", "key": "k"}', b"{\x00}",
]


def _inputs(rnd: random.Random, method: str, seeds: list[list[bytes]], n: int
            ) -> list[list[bytes]]:
    """`n` request streams: a third random bytes, the rest mutated seeds."""
    flat = [m for s in seeds for m in s if m]
    out = []
    for i in range(n):
        if i % 3 == 0:
            count = rnd.randint(0, 3) if METHODS[method][1] else 1
            out.append([rnd.randbytes(rnd.choice([0, 1, 2, 5, 17, 64, 300]))
                        for _ in range(count)])
            continue
        stream = list(rnd.choice(seeds))
        k = rnd.randrange(len(stream))
        for _ in range(rnd.choice([1, 1, 1, 2, 3])):
            stream[k] = mutate(rnd, stream[k], flat)
        out.append(stream)
    return out


def _may_wait(method: str, stream: list[bytes]) -> bool:
    """A Stat reading through offsets waits for the shard to commit them."""
    try:
        return method == "Stat" and bool(cpb.StatRequest.FromString(stream[0]).read_through)
    except Exception:  # noqa: BLE001 - not parseable: it must not wait
        return False


def served_wrongly(method: str, waits: bool, code: str, details: str) -> str:
    """Why this answer to a caller with every capability is wrong ("" if it is not)."""
    if code == "OK" or (code == "DEADLINE_EXCEEDED" and waits):
        return ""
    if code == "NOT_FOUND" and method == "Check":
        return ""  # the health of a service it does not know
    if code == "INVALID_ARGUMENT":
        if not details or "Unexpected" in details or "Traceback" in details:
            return "INVALID_ARGUMENT without a reason naming the field"
        return ""
    return f"{code}: {details[:200]}"


async def test_malformed_protobuf_and_json_to_every_method(
        fuzzed_member: MemberProcess, report: Callable[..., None]) -> None:
    rnd = random.Random(34)
    seeds = _seeds()
    assert set(seeds) == set(METHODS), "a method without seeds"
    work = [(m, s) for m in sorted(seeds)
            for s in _inputs(rnd, m, seeds[m], INPUTS_PER_METHOD)]
    work += [("Total", [raw]) for raw in HOSTILE_JSON]
    async with case(fuzzed_member) as info, \
            grpc.aio.insecure_channel(fuzzed_member.grpc_address) as channel:
        codes, wrong = await answers(
            work, lambda m, s: call(channel, m, s, WAITING_DEADLINE if _may_wait(m, s)
                                    else DEADLINE),
            lambda m, s, code, details: served_wrongly(m, _may_wait(m, s), code, details))
        growth = fuzzed_member.rss_mib() - info["rss"]
        elapsed = time.monotonic() - info["start"]
    report("member-malformed", len(work), len(wrong),
           f"{counts(codes)}; growth {growth:.0f} MiB; {elapsed:.1f}s")
    assert not wrong, "\n".join(wrong[:20])
    assert codes["INVALID_ARGUMENT"] > len(work) // 3  # most inputs are malformed
    assert growth < MAX_GROWTH_MIB


# -- 2. lying length prefixes -------------------------------------------------------------


async def test_huge_and_lying_length_prefixes(fuzzed_member: MemberProcess,
                                              report: Callable[..., None]) -> None:
    host, port = "127.0.0.1", fuzzed_member.grpc_port
    token_header = [(b"authorization", f"Bearer {admin()}".encode())]
    wrong: list[str] = []
    seen: collections.Counter[str] = collections.Counter()
    inputs = 0
    refused = {grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
               grpc.StatusCode.UNAUTHENTICATED.value[0]}
    async with case(fuzzed_member) as info:
        h2c = await RawH2.connect(host, port)
        try:
            sent: list[tuple[int, str, str, bool]] = []
            for method, (path, _) in METHODS.items():
                for authorized in (True, False):
                    extra = token_header if authorized else []
                    # Claims beyond the receive limit: refused before any is buffered.
                    for claim in (2**32 - 1, 2**31, (64 << 20) + 1):
                        sid = h2c.request(path, extra)
                        h2c.send(sid, grpc_prefix(claim) + b"\x0a\x02hi", end_stream=True)
                        sent.append((sid, method, f"claims {claim}", authorized))
                    # Claims more than is sent, then ends: the request is incomplete.
                    for claim, size in ((60 << 20, 100), (100, 10), (2, 0)):
                        sid = h2c.request(path, extra)
                        h2c.send(sid, grpc_prefix(claim) + bytes(size), end_stream=True)
                        sent.append((sid, method, f"claims {claim}, sends {size}",
                                     authorized))
                    # Flagged compressed, with no compression named.
                    sid = h2c.request(path, extra)
                    h2c.send(sid, grpc_prefix(4, compressed=True) + b"\x12\x02hi",
                             end_stream=True)
                    sent.append((sid, method, "compressed", authorized))
                    # Left open with a deadline.
                    sid = h2c.request(path, extra, timeout="1S")
                    h2c.send(sid, grpc_prefix(60 << 20) + bytes(100))
                    sent.append((sid, method, "left open", authorized))
            await h2c.flush()
            for sid, method, what, authorized in sent:
                out = await h2c.outcome(sid, 5)
                inputs += 1
                seen[str(out).split(" '")[0]] += 1
                code = out.grpc_status
                cut = out.reset is not None or out.connection_closed
                if what.startswith("claims") and "sends" not in what:
                    ok = code in refused or cut
                elif out.timed_out:
                    ok = False
                elif what == "compressed":  # gRPC's own refusal, before any token's
                    ok = code == grpc.StatusCode.INTERNAL.value[0] and \
                        "ompress" in out.grpc_message
                elif not authorized and method != "Check":
                    ok = code in refused or cut  # no token: refused, whatever it holds
                elif what == "left open":
                    ok = code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0] or cut
                else:
                    ok = code == grpc.StatusCode.INVALID_ARGUMENT.value[0] or (
                        method == "Gather" and code == 0)  # an empty stream sums nothing
                if not ok:
                    wrong.append(f"{method} {what} ({'with' if authorized else 'no'} "
                                 f"token): {out}")
        finally:
            await h2c.close()

        # Many streams holding incomplete messages that claim 60 MiB: nothing is
        # allocated for what is claimed.
        before = fuzzed_member.rss_mib()
        conns = [await RawH2.connect(host, port) for _ in range(2)]
        try:
            for h2c in conns:
                for _ in range(250):
                    sid = h2c.request(METHODS["Total"][0], token_header)
                    h2c.send(sid, grpc_prefix(60 << 20) + bytes(1024))
                await h2c.flush()
                inputs += 250
            await conns[-1].pump(lambda: False, 1.0)  # let the member take them in
            held = fuzzed_member.rss_mib() - before
        finally:
            for h2c in conns:
                await h2c.close()
        growth = fuzzed_member.rss_mib() - info["rss"]
    report("member-length-prefix", inputs, len(wrong),
           f"{counts(seen)}; 500 streams claiming 60 MiB held {held:.0f} MiB; growth "
           f"{growth:.0f} MiB; {time.monotonic() - info['start']:.1f}s")
    assert not wrong, "\n".join(wrong[:20])
    assert held < 100 and growth < MAX_GROWTH_MIB


# -- 3. invalid UTF-8 and odd Unicode -----------------------------------------------------


def _no_shard(shard: str) -> str:
    return str(ValidationError("shard", f"no shard {shard!r}"))


def _grpc_unicode_inputs() -> list[tuple[str, list[bytes], str]]:
    """(method, request stream, the INVALID_ARGUMENT details it must get, or "" for one
    to be served, or "<prefix>..." for details that must start with <prefix>)."""
    out: list[tuple[str, list[bytes], str]] = []
    for text in hypothesis_examples(odd_text, 150):
        shard = f"fuzz/{text}"
        refusal = expected_refusal(lambda s=shard: names.validate_shard_id(s, "shard"))
        out.append(("Echo", [cpb.StatRequest(shard=shard).SerializeToString()], refusal))
        out.append(("Stat", [cpb.StatRequest(shard=shard).SerializeToString()], refusal))
        out.append(("Total", [total_request(shard)], refusal or _no_shard(shard)))
    for raw in hypothesis_examples(bad_bytes, 100):
        field = ld(2, b"fuzz/" + raw)  # shard is field 2 of a StatRequest
        out.append(("Echo", [field], "shard: not valid UTF-8..."))
        out.append(("Stat", [field], "shard: not valid UTF-8..."))
        out.append(("Total", [b'{"shard": "fuzz/' + raw + b'", "key": "k"}'], "request: ..."))
    return out


def _http_unicode_inputs() -> list[tuple[str, int, str]]:
    """(raw path and query, the status it must get, and the key it must echo (200) or
    the error it must say (400))."""
    out: list[tuple[str, int, str]] = []

    def key_case(encoded: str) -> None:
        url = URL("/sums/" + encoded, encoded=True)
        if set("/{}") & set(url.path_safe[len("/sums/"):]):  # aiohttp's {key}: [^{}/]+
            out.append((f"/sums/{encoded}?shard=shard-0", 404, ""))
        else:
            out.append((f"/sums/{encoded}?shard=shard-0", 200, url.path[len("/sums/"):]))

    def shard_case(raw: bytes) -> None:
        seen = URL(f"/?v={quote(raw, safe='')}", encoded=True).query["v"]
        refusal = expected_refusal(lambda: names.validate_shard_id(seen, "shard"))
        out.append((f"/sums/k?shard={quote(raw, safe='')}", 400, refusal or _no_shard(seen)))

    for text in hypothesis_examples(odd_text, 150):
        key_case(quote(text.encode(), safe="/"))
        shard_case(f"fuzz/{text}".encode())
    for raw in hypothesis_examples(bad_bytes, 100):
        key_case(quote(raw, safe="/"))
        shard_case(b"fuzz/" + raw)
    return out


async def test_invalid_utf8_and_odd_unicode_in_shard_ids_and_paths(
        fuzzed_member: MemberProcess, report: Callable[..., None]) -> None:
    grpc_inputs = _grpc_unicode_inputs()
    http_inputs = _http_unicode_inputs()
    auth = f"Authorization: Bearer {admin()}\r\n".encode()
    raw_lines = [b"GET /sums/" + raw + b"?shard=shard-0 HTTP/1.1\r\nHost: x\r\n" + auth +
                 b"\r\n" for raw in [*BAD_UTF8, *(s.encode() for s in ODD)]]
    wrong: list[str] = []
    codes: collections.Counter[str] = collections.Counter()
    limit = asyncio.Semaphore(32)
    async with case(fuzzed_member) as info, \
            grpc.aio.insecure_channel(fuzzed_member.grpc_address) as channel, \
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {admin()}"}) as http:

        async def via_grpc(method: str, stream: list[bytes], expected: str) -> None:
            async with limit:
                code, details = await call(channel, method, stream, DEADLINE)
            codes[f"grpc {code}"] += 1
            if expected.endswith("..."):
                ok = code == "INVALID_ARGUMENT" and details.startswith(expected[:-3])
            elif expected:
                ok = code == "INVALID_ARGUMENT" and details == expected
            else:
                ok = code == "OK"
            if not ok:
                wrong.append(f"gRPC {method} {stream!r}: {code} {details!r}, expected "
                             f"{expected or 'OK'!r}")

        async def via_http(path: str, status: int, expected: str) -> None:
            async with limit, http.get(URL(fuzzed_member.http_url + path, encoded=True)) as r:
                got, body = r.status, await r.read()
            codes[f"http {got}"] += 1
            said = json.loads(body) if got in (200, 400) else {}
            ok = got == status and (
                status == 404 or said.get("key" if status == 200 else "error") == expected)
            if not ok:
                wrong.append(f"HTTP GET {path}: {got} {body[:200]!r}, expected {status} "
                             f"{expected!r}")

        async def raw_line(request: bytes) -> None:
            async with limit:
                status_line = await raw_http(fuzzed_member.http_port, request)
            codes[f"raw {status_line[9:12].decode(errors='replace') or 'closed'}"] += 1
            if status_line[9:12] != b"400":
                wrong.append(f"HTTP {request[:60]!r}: {status_line!r}, expected 400")

        await asyncio.gather(*(via_grpc(*i) for i in grpc_inputs),
                             *(via_http(*i) for i in http_inputs),
                             *(raw_line(r) for r in raw_lines))
        elapsed = time.monotonic() - info["start"]
    total = len(grpc_inputs) + len(http_inputs) + len(raw_lines)
    report("member-unicode", total, len(wrong), f"{counts(codes)}; {elapsed:.1f}s")
    assert not wrong, "\n".join(wrong[:20])


