"""Bad input to an assembled broker (`BrokerServer` on real etcd): malformed names and
specs, oversize appends, clients that vanish mid-append, malformed HTTP requests and
corrupt fragments in the store.

Every case checks two things: the refusal is clear (a gRPC code or HTTP status and a
message naming the field or the reason), and the broker keeps serving afterwards with
nothing of the bad request committed (the write head is where it was, the journal's
content is exactly what was appended before, and a normal append and read on the same
journal still work).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf import duration_pb2
from yarl import URL

from gazette.fragment import Fragment, compress, decompress
from gazette.local.etcd import EmbeddedEtcd
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import journal_spec_to_pb
from gazette.protocol.trees import journal_changes_from_yaml
from gazette_broker import BrokerServer
from gazette_broker.replica import APPENDS
from tests.fixtures.broker import broker_config, started_broker
from tests.fixtures.relay import Relay

pytestmark = pytest.mark.integration

MiB = 1 << 20
JOURNAL = "bad/input"
SPECS = """
name: bad/
replication: 1
labels: [{name: content-type, value: application/x-ndjson}]
fragment:
  length: 1073741824
  compression_codec: NONE
  stores: ["file:///"]
  refresh_interval: 1h0m0s
  flush_interval: 0s
children:
  - name: bad/input
  - name: bad/gzip
    fragment: {compression_codec: GZIP}
  - name: bad/snappy
    fragment: {compression_codec: SNAPPY}
  - name: bad/read-only
    flags: O_RDONLY
"""
#: What each test appends first, so "unchanged" means a write head other than 0.
BEFORE = b'{"n": 1, "msg": "before"}\n'
#: The broker's append limit where a test needs a small one.
SMALL_LIMIT = 64 << 10
#: Names `names.validate_journal_name` refuses, with a part of the reason it gives.
BAD_NAMES = [
    ("", "shorter than 2 characters"),
    ("x", "shorter than 2 characters"),
    ("bad name", "invalid character ' '"),
    ("/leading", "must not begin with '/'"),
    ("trailing/", "must not end with '/'"),
    ("a//b", "must not contain '//'"),
    ("a/../b", "must not contain a '..' component"),
    ("j\u00f6urnal", "invalid character '\u00f6'"),
    ("a\nb", "invalid character U+000A"),
    ("a" * 513, "longer than 512 characters"),
]
RPC_TIMEOUT = 10.0


# -- fixtures and helpers ---------------------------------------------------------------


@pytest.fixture
async def broker(broker_server: BrokerServer) -> BrokerServer:
    await broker_server.apply_yaml(SPECS)
    return broker_server


@pytest.fixture
async def small_broker(etcd_server: EmbeddedEtcd, etcd_prefix: str,
                       tmp_path: Path) -> AsyncIterator[BrokerServer]:
    """A broker that accepts appends of at most `SMALL_LIMIT` bytes."""
    async with started_broker(etcd_server, etcd_prefix, tmp_path, SPECS,
                              max_append_size=SMALL_LIMIT) as server:
        yield server


@contextlib.asynccontextmanager
async def journal_stub(server: BrokerServer) -> AsyncIterator[broker_pb2_grpc.JournalStub]:
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        yield broker_pb2_grpc.JournalStub(channel)


@pytest.fixture
async def stub(broker: BrokerServer) -> AsyncIterator[broker_pb2_grpc.JournalStub]:
    async with journal_stub(broker) as s:
        yield s


def append_requests(journal: str, *parts: bytes, commit: bool = True,
                    **meta: Any) -> list[pb.AppendRequest]:
    reqs = [pb.AppendRequest(journal=journal, **meta)]
    reqs += [pb.AppendRequest(content=p) for p in parts]
    if commit:
        reqs.append(pb.AppendRequest())
    return reqs


async def append(stub: broker_pb2_grpc.JournalStub, journal: str, *parts: bytes,
                 **meta: Any) -> pb.AppendResponse:
    return await stub.Append(iter(append_requests(journal, *parts, **meta)),
                             timeout=RPC_TIMEOUT)


async def read_all(stub: broker_pb2_grpc.JournalStub, journal: str, offset: int = 0,
                   **kw: Any) -> bytes:
    return b"".join([r.content async for r in stub.Read(
        pb.ReadRequest(journal=journal, offset=offset, **kw), timeout=RPC_TIMEOUT)])


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    """The error an RPC (a unary call or a response stream) fails with."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    return err.value


def spool_bytes(server: BrokerServer, journal: str) -> int:
    """Bytes in the journal's spool file: committed content plus any append in progress."""
    return os.path.getsize(server.broker.replicas[journal].spool.path)


def committed_spool_bytes(server: BrokerServer, journal: str) -> int:
    replica = server.broker.replicas[journal]
    return replica.write_head - replica.spool.begin


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.005)


async def assert_still_serving(server: BrokerServer, journal: str, committed: bytes,
                               begin: int = 0) -> None:
    """Nothing but `committed` is in `journal` from `begin` on, and a normal append (at
    the unchanged write head) and read of it work, over gRPC and HTTP."""
    replica = server.broker.replicas[journal]
    head = begin + len(committed)
    assert replica.write_head == head
    assert spool_bytes(server, journal) == committed_spool_bytes(server, journal), \
        "an aborted append left bytes in the spool"
    after = b'{"n": 2, "msg": "after"}\n'
    async with journal_stub(server) as stub:
        assert await read_all(stub, journal, begin) == committed
        resp = await append(stub, journal, after, offset=head)
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        assert (resp.commit.begin, resp.commit.end) == (head, head + len(after))
        assert await read_all(stub, journal, begin) == committed + after
    async with aiohttp.ClientSession() as http, \
            http.get(f"{server.http_url}/{journal}?offset={begin}") as r:
        assert r.status == 200 and await r.read() == committed + after


async def append_before(server: BrokerServer, journal: str = JOURNAL) -> None:
    async with journal_stub(server) as stub:
        resp = await append(stub, journal, BEFORE)
        assert resp.status == pb.OK


# -- a. journal names ---------------------------------------------------------------------


async def test_invalid_journal_names_in_append_are_invalid_argument(
        broker: BrokerServer, stub: broker_pb2_grpc.JournalStub) -> None:
    await append_before(broker)
    for name, reason in BAD_NAMES:
        err = await rpc_error(stub.Append(iter(append_requests(name, b"x\n")),
                                          timeout=RPC_TIMEOUT))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert (err.details() or "").startswith("journal: "), err.details()
        assert reason in (err.details() or ""), (name, err.details())
    await assert_still_serving(broker, JOURNAL, BEFORE)


async def test_invalid_journal_names_in_read_are_invalid_argument(
        broker: BrokerServer, stub: broker_pb2_grpc.JournalStub) -> None:
    await append_before(broker)
    for name, reason in BAD_NAMES:
        for request in (pb.ReadRequest(journal=name),
                        pb.ReadRequest(journal=name, offset=-1, block=True),
                        pb.ReadRequest(journal=name, metadata_only=True)):
            err = await rpc_error(stub.Read(request, timeout=RPC_TIMEOUT))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert (err.details() or "").startswith("journal: "), err.details()
            assert reason in (err.details() or ""), (name, err.details())
    await assert_still_serving(broker, JOURNAL, BEFORE)


async def test_invalid_journal_names_in_list_fragments_are_invalid_argument(
        broker: BrokerServer, stub: broker_pb2_grpc.JournalStub) -> None:
    await append_before(broker)
    for name, reason in BAD_NAMES:
        err = await rpc_error(stub.ListFragments(pb.FragmentsRequest(journal=name),
                                                 timeout=RPC_TIMEOUT))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert (err.details() or "").startswith("journal: "), err.details()
        assert reason in (err.details() or ""), (name, err.details())
    await assert_still_serving(broker, JOURNAL, BEFORE)


async def test_unknown_journals_are_journal_not_found(
        broker: BrokerServer, stub: broker_pb2_grpc.JournalStub) -> None:
    await append_before(broker)
    for name in ("no/such-journal", "Bad/input", "bad/input/deeper", "bad"):
        resp = await append(stub, name, b"lost\n")
        assert resp.status == pb.JOURNAL_NOT_FOUND, name
        assert not resp.commit.journal
        reads = [r async for r in stub.Read(pb.ReadRequest(journal=name),
                                            timeout=RPC_TIMEOUT)]
        assert [r.status for r in reads] == [pb.JOURNAL_NOT_FOUND], name
        assert not reads[0].content and reads[0].header.etcd.revision > 0
        blocking = [r async for r in stub.Read(pb.ReadRequest(
            journal=name, offset=-1, block=True), timeout=RPC_TIMEOUT)]
        assert [r.status for r in blocking] == [pb.JOURNAL_NOT_FOUND], name
        frags = await stub.ListFragments(pb.FragmentsRequest(journal=name),
                                         timeout=RPC_TIMEOUT)
        assert frags.status == pb.JOURNAL_NOT_FOUND and not frags.fragments
    assert set(broker.broker.replicas) == {c.name for c in journal_changes_from_yaml(SPECS)
                                           if c.spec is not None}
    await assert_still_serving(broker, JOURNAL, BEFORE)


# -- b. specs in Apply --------------------------------------------------------------------


def _spec_pb(name: str = JOURNAL) -> pb.JournalSpec:
    for change in journal_changes_from_yaml(SPECS):
        if change.name == name and change.spec is not None:
            return journal_spec_to_pb(change.spec)
    raise KeyError(name)


def _bad_specs() -> list[tuple[pb.JournalSpec, str]]:
    """Invalid edits of `JOURNAL`'s spec, each with the field and reason its refusal
    must name."""
    out: list[tuple[pb.JournalSpec, str]] = []

    def bad(field: str, **values: Any) -> pb.JournalSpec:
        spec = _spec_pb()
        for name, value in values.items():
            setattr(spec, name, value)
        out.append((spec, field))
        return spec

    bad("upsert.replication: ", replication=0)
    bad("upsert.replication: ", replication=-1)
    bad("upsert.name: 'bad//input' must not contain '//'", name="bad//input")
    bad("upsert.max_append_rate: ", max_append_rate=-1)
    bad("upsert.fragment.compression_codec: unknown or unset codec 99"
        ).fragment.compression_codec = 99
    bad("upsert.fragment.compression_codec: unknown or unset codec 0"
        ).fragment.compression_codec = pb.COMPRESSION_CODEC_UNSPECIFIED
    bad("upsert.fragment.length: ").fragment.length = 0
    for url, reason in [("ftp://bucket/", "scheme must be one of file://, s3://"),
                        ("file:///no-slash", "path must end with '/'"),
                        ("file:///a/../b/", "path must not contain '.' or '..'"),
                        ("s3://Bad_Bucket/", "'Bad_Bucket' is not a valid S3 bucket name"),
                        ("file:///has space/", "must not contain whitespace"),
                        ("file://host/x/", "file stores have no host")]:
        bad(f"upsert.fragment.stores[0]: {url!r}: {reason}").fragment.stores[0] = url
    twice = bad("upsert.fragment.stores[1]: 'file:///' is listed twice")
    twice.fragment.stores.append("file:///")
    for field in ("retention", "refresh_interval", "flush_interval"):
        for negative in (duration_pb2.Duration(seconds=-1),
                         duration_pb2.Duration(seconds=0, nanos=-1)):
            getattr(bad(f"upsert.fragment.{field}: must not be negative").fragment,
                    field).CopyFrom(negative)
    return out


async def _listing(stub: broker_pb2_grpc.JournalStub) -> dict[str, tuple[bytes, int]]:
    """Each journal's spec (serialized) and mod revision, as List answers."""
    resp = await anext(aiter(stub.List(pb.ListRequest(), timeout=RPC_TIMEOUT)))
    assert resp.status == pb.OK
    return {j.spec.name: (j.spec.SerializeToString(deterministic=True), j.mod_revision)
            for j in resp.journals}


async def test_invalid_specs_in_apply_are_invalid_argument_and_change_nothing(
        broker: BrokerServer, stub: broker_pb2_grpc.JournalStub) -> None:
    await append_before(broker)
    before = await _listing(stub)
    assert len(before) == 4
    revision = before[JOURNAL][1]
    replica_spec = broker.broker.replicas[JOURNAL].spec
    for spec, expected in _bad_specs():
        for change in (pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=revision),
                       pb.ApplyRequest.Change(upsert=spec)):  # an edit, a creation
            err = await rpc_error(stub.Apply(pb.ApplyRequest(changes=[change]),
                                             timeout=RPC_TIMEOUT))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, expected
            assert f"changes[0].{expected}" in (err.details() or ""), \
                (expected, err.details())
    assert await _listing(stub) == before
    assert broker.broker.replicas[JOURNAL].spec == replica_spec
    await assert_still_serving(broker, JOURNAL, BEFORE)


async def test_an_apply_with_one_invalid_change_applies_none(
        broker: BrokerServer, stub: broker_pb2_grpc.JournalStub) -> None:
    before = await _listing(stub)
    good = _spec_pb()
    good.name = "bad/new-journal"
    bad = _spec_pb()
    bad.name = "bad/other-new-journal"
    bad.fragment.compression_codec = 42
    err = await rpc_error(stub.Apply(pb.ApplyRequest(changes=[
        pb.ApplyRequest.Change(upsert=good),
        pb.ApplyRequest.Change(upsert=bad),
        pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=1),
    ]), timeout=RPC_TIMEOUT))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "changes[1].upsert.fragment.compression_codec" in (err.details() or "")
    # A change that is neither an upsert nor a delete, and a delete of a bad name.
    err = await rpc_error(stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change()]),
                                     timeout=RPC_TIMEOUT))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "changes[0]: neither upsert nor delete" in (err.details() or "")
    err = await rpc_error(stub.Apply(pb.ApplyRequest(changes=[
        pb.ApplyRequest.Change(delete="/bad/input", expect_mod_revision=1)]),
        timeout=RPC_TIMEOUT))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "changes[0].delete" in (err.details() or "")
    assert await _listing(stub) == before
    assert "bad/new-journal" not in broker.broker.replicas
    await assert_still_serving(broker, JOURNAL, b"")


async def test_a_valid_spec_whose_store_is_down_does_not_stop_the_broker(
        broker: BrokerServer, stub: broker_pb2_grpc.JournalStub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Credentials, so the S3 store really tries (and fails) to connect.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    await append_before(broker)
    dead = _spec_pb()
    dead.name = "bad/dead-store"
    dead.fragment.stores[0] = "s3://bucket/?endpoint=http://127.0.0.1:1&region=us-east-1"
    later = _spec_pb()
    later.name = "bad/later"
    for spec in (dead, later):  # both valid: Apply takes them
        resp = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(
            upsert=spec)]), timeout=RPC_TIMEOUT)
        assert resp.status == pb.OK
    # The broker goes on following etcd: the journal applied after it is served. (The
    # dead store's listing fails within about a second.)
    async with asyncio.timeout(6):
        await broker.broker.wait_serving({"bad/later"})
    await assert_still_serving(broker, "bad/later", b"")
    await assert_still_serving(broker, JOURNAL, BEFORE)
    # The journal with the dead store is not served, and says why.
    assert "bad/dead-store" not in broker.broker.replicas
    err = await rpc_error(stub.Append(iter([pb.AppendRequest(journal="bad/dead-store"),
                                            pb.AppendRequest(content=b"x"),
                                            pb.AppendRequest()]), timeout=RPC_TIMEOUT))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "journal bad/dead-store is not served yet: its fragment stores cannot be " \
        "listed" in (err.details() or "")
    async with aiohttp.ClientSession() as http, \
            http.get(f"{broker.http_url}/bad/dead-store") as r:
        assert r.status == 503
        assert "bad/dead-store is not served yet" in await r.text()
    # Stopping drains what this broker holds: the journal it never opened holds nothing,
    # so the drain does not wait its timeout for it (it did: a minute per stop).
    assert await broker.drain(timeout=15), "the drain waited for a journal never opened"


# -- c. oversize appends over gRPC --------------------------------------------------------


async def test_an_append_over_the_size_limit_is_refused_over_grpc(
        small_broker: BrokerServer) -> None:
    await append_before(small_broker)
    async with journal_stub(small_broker) as stub:
        # The limit itself is fine.
        exact = await append(stub, JOURNAL, b"a" * (SMALL_LIMIT // 2),
                             b"b" * (SMALL_LIMIT - SMALL_LIMIT // 2))
        assert exact.status == pb.OK and exact.commit.end - exact.commit.begin == SMALL_LIMIT
        committed = BEFORE + b"a" * (SMALL_LIMIT // 2) + b"b" * (SMALL_LIMIT - SMALL_LIMIT // 2)
        refused = APPENDS.labels("APPEND_TOO_LARGE")._value.get()
        # One byte over, in several messages (the last one crosses the limit), and in one
        # message larger than the limit.
        for parts in ([b"c" * (SMALL_LIMIT // 4)] * 4 + [b"!"],
                      [b"d" * (SMALL_LIMIT + 1)],
                      [b"e" * (16 << 10)] * 64):  # 1 MiB: far over, still streaming
            resp = await append(stub, JOURNAL, *parts)
            assert resp.status == pb.APPEND_TOO_LARGE, pb.Status.Name(resp.status)
            assert not resp.commit.journal and not resp.commit.end
            assert small_broker.broker.replicas[JOURNAL].write_head == len(committed)
        assert APPENDS.labels("APPEND_TOO_LARGE")._value.get() - refused == 3
    await assert_still_serving(small_broker, JOURNAL, committed)


# -- d. clients that go away mid-append ---------------------------------------------------


async def _start_append(stub: broker_pb2_grpc.JournalStub, server: BrokerServer,
                        content: bytes) -> Any:
    """An append stream that has sent its metadata and `content` (in 1 MiB messages),
    but no commit, once the broker has written all of it into the spool."""
    call = stub.Append(timeout=60)
    await call.write(pb.AppendRequest(journal=JOURNAL))
    for i in range(0, len(content), MiB):
        await call.write(pb.AppendRequest(content=content[i:i + MiB]))
    expected = committed_spool_bytes(server, JOURNAL) + len(content)
    await until(lambda: spool_bytes(server, JOURNAL) == expected,
                "the broker wrote the uncommitted content into the spool")
    return call


async def _aborted(server: BrokerServer) -> None:
    """Wait until the broker has rolled back the aborted append."""
    await until(lambda: spool_bytes(server, JOURNAL) == committed_spool_bytes(server, JOURNAL),
                "the aborted append was rolled back")


async def test_an_append_cancelled_mid_stream_commits_nothing(
        broker: BrokerServer, stub: broker_pb2_grpc.JournalStub) -> None:
    await append_before(broker)
    aborted = APPENDS.labels("ABORTED")._value.get()
    call = await _start_append(stub, broker, os.urandom(3 * MiB))
    assert call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await _aborted(broker)
    await until(lambda: APPENDS.labels("ABORTED")._value.get() == aborted + 1,
                "the broker counted the aborted append")
    await assert_still_serving(broker, JOURNAL, BEFORE)


async def test_an_append_whose_channel_closes_mid_stream_commits_nothing(
        broker: BrokerServer) -> None:
    await append_before(broker)
    channel = grpc.aio.insecure_channel(broker.grpc_address)
    try:
        call = await _start_append(broker_pb2_grpc.JournalStub(channel), broker,
                                   os.urandom(2 * MiB + 123))
    finally:
        await channel.close()
    assert call.done()
    await _aborted(broker)
    await assert_still_serving(broker, JOURNAL, BEFORE)


async def test_an_append_whose_connection_is_cut_mid_stream_commits_nothing(
        broker: BrokerServer) -> None:
    await append_before(broker)
    async with Relay(broker.grpc_address) as relay, \
            grpc.aio.insecure_channel(relay.address) as channel:
        call = await _start_append(broker_pb2_grpc.JournalStub(channel), broker,
                                   os.urandom(2 * MiB))
        relay.cut()
        await _aborted(broker)
        err = await rpc_error(call)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
    await assert_still_serving(broker, JOURNAL, BEFORE)


async def test_an_append_stream_ending_without_its_commit_is_cancelled(
        broker: BrokerServer, stub: broker_pb2_grpc.JournalStub) -> None:
    await append_before(broker)
    call = await _start_append(stub, broker, os.urandom(2 * MiB))
    await call.done_writing()  # half-close: no commit message
    err = await rpc_error(call)
    assert err.code() == grpc.StatusCode.CANCELLED
    assert "without its commit message" in (err.details() or "")
    assert "nothing was appended" in (err.details() or "")
    await _aborted(broker)
    # The same without any content, and a stream with no message at all.
    err = await rpc_error(stub.Append(iter(append_requests(JOURNAL, commit=False)),
                                      timeout=RPC_TIMEOUT))
    assert err.code() == grpc.StatusCode.CANCELLED
    err = await rpc_error(stub.Append(iter([]), timeout=RPC_TIMEOUT))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "empty append stream" in (err.details() or "")
    # Content in the metadata message is refused before anything is written.
    err = await rpc_error(stub.Append(iter([pb.AppendRequest(journal=JOURNAL, content=b"x"),
                                            pb.AppendRequest()]), timeout=RPC_TIMEOUT))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith("content: ")
    await assert_still_serving(broker, JOURNAL, BEFORE)


# -- e. malformed HTTP requests -----------------------------------------------------------


def _one_line(text: str) -> str:
    """`text` without its line end, which must be its only one."""
    assert text.strip() and "\n" not in text.strip(), f"not one line: {text!r}"
    return text.strip()


@pytest.mark.parametrize(("method", "path", "status", "reason"), [
    ("DELETE", f"/{JOURNAL}", 405, "Method Not Allowed"),
    ("PATCH", f"/{JOURNAL}", 405, "Method Not Allowed"),
    ("DELETE", "/metrics", 405, "Method Not Allowed"),
    ("POST", "/no/such/journal", 404, "JOURNAL_NOT_FOUND: no/such/journal"),
    ("PUT", "/bad%20name", 400, "journal: 'bad name' has invalid character ' '"),
    ("PUT", "/a//b", 400, "journal: 'a//b' must not contain '//'"),
    ("GET", "/a//b", 400, "journal: 'a//b' must not contain '//'"),
    ("GET", "//leading", 400, "journal: '/leading' must not begin with '/'"),
    ("GET", f"/{JOURNAL}/", 400, "must not end with '/'"),
    ("GET", "/a/../b", 400, "journal: 'a/../b' must not contain a '..' component"),
    ("GET", "/" + "a" * 513, 400, "journal: is longer than 512 characters (513)"),
    ("GET", "/x", 400, "journal: 'x' is shorter than 2 characters"),
    ("GET", f"/{JOURNAL}?offset=1e3", 400, "offset: expected an integer, got '1e3'"),
    ("GET", f"/{JOURNAL}?offset=-5", 400, "offset: must be at least -1, got -5"),
    ("GET", f"/{JOURNAL}?end_offset=-1", 400, "end_offset: must be at least 0, got -1"),
    ("GET", f"/{JOURNAL}?end_offset=ten", 400, "end_offset: expected an integer"),
    ("GET", f"/{JOURNAL}?block=2", 400, "block: expected true or false, got '2'"),
    ("GET", f"/{JOURNAL}?offset={len(BEFORE) + 10}", 416, "OFFSET_NOT_YET_AVAILABLE"),
    ("PUT", "/bad/read-only", 403, "NOT_ALLOWED: bad/read-only is read-only"),
])
async def test_malformed_http_requests_get_a_clear_4xx(
        broker: BrokerServer, method: str, path: str, status: int, reason: str) -> None:
    await append_before(broker)
    async with aiohttp.ClientSession() as http:
        url = URL(broker.http_url + path, encoded=True)
        async with http.request(method, url, data=b"not appended\n") as r:
            assert r.status == status, await r.text()
            assert reason in _one_line(await r.text())
    await assert_still_serving(broker, JOURNAL, BEFORE)


async def _put_status(url: str, body: Any, **kw: Any) -> tuple[int, str]:
    """PUT `body`; the status and text of the answer. The gateway may answer (and close)
    before it read the whole body: then the client's write fails after the answer."""
    async with aiohttp.ClientSession() as http, http.put(url, data=body, **kw) as r:
        return r.status, await r.text()


async def test_an_oversize_http_put_is_413(small_broker: BrokerServer) -> None:
    await append_before(small_broker)
    url = f"{small_broker.http_url}/{JOURNAL}"

    # Declared too large by Content-Length: refused before any of the body is read.
    status, text = await _put_status(url, b"x" * (SMALL_LIMIT + 1))
    assert status == 413
    assert _one_line(text) == (f"append of {SMALL_LIMIT + 1} bytes is larger than the "
                               f"{SMALL_LIMIT}-byte limit")

    # Chunked, no length: refused once the limit is crossed; nothing of it lands.
    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b"y" * (16 << 10)

    status, text = await _put_status(url, chunked())
    assert status == 413
    assert "larger than the 65536-byte limit" in _one_line(text)
    assert small_broker.broker.replicas[JOURNAL].write_head == len(BEFORE)
    status, _ = await _put_status(url, b"z" * SMALL_LIMIT)  # the limit itself is fine
    assert status == 204
    await assert_still_serving(small_broker, JOURNAL, BEFORE + b"z" * SMALL_LIMIT)


async def test_a_garbled_http_request_gets_400_and_the_gateway_keeps_serving(
        broker: BrokerServer) -> None:
    await append_before(broker)
    host, port = broker.http_url.removeprefix("http://").split(":")
    for raw in (b"GARBAGE\r\n\r\n",
                f"PUT /{JOURNAL} HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\nx\n".encode(),
                f"PUT /{JOURNAL} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                "zz\r\nnot hex\r\n0\r\n\r\n".encode()):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(raw)
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), RPC_TIMEOUT)
            assert status_line.split(b" ")[1] == b"400", (raw, status_line)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    await assert_still_serving(broker, JOURNAL, BEFORE)


# -- f. corrupt fragments in the store ----------------------------------------------------


async def _persist(server: BrokerServer, journal: str, parts: list[bytes]) -> list[Fragment]:
    """Append each of `parts` as a fragment of its own and persist them; then append an
    open-spool line. Returns the persisted fragments (never read, so not cached)."""
    replica = server.broker.replicas[journal]
    async with journal_stub(server) as stub:
        for part in parts:
            assert (await append(stub, journal, part)).status == pb.OK
            await replica.roll()
        await asyncio.wait_for(server.broker.persister.wait_idle(), 30)
        assert (await append(stub, journal, OPEN_SPOOL)).status == pb.OK
    frags = [f for f in replica.fragments() if f.backing_store]
    assert [f.size for f in frags] == [len(p) for p in parts]
    return frags


OPEN_SPOOL = b'{"msg": "in the open spool"}\n'
GOOD = b'{"msg": "good"}\n' * 200
BAD = b'{"msg": "to be corrupted"}\n' * 200


def _stored(server: BrokerServer, frag: Fragment) -> Path:
    path = Path(server.file_root or "") / frag.path
    assert path.is_file(), path
    return path


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0xFF
    return bytes(out)


async def _assert_data_loss(server: BrokerServer, journal: str, frags: list[Fragment],
                            parts: list[bytes], corrupt: Fragment, *, over_grpc: bool = True,
                            over_http: bool = True, undecodable: bool = False) -> None:
    """Reads of `corrupt` fail (gRPC DATA_LOSS, HTTP 500) naming it, every time, and
    never yield its bytes; the other fragments and the open spool read fine. (The HTTP
    reason of an `undecodable` one may name the journal and offset instead.)"""
    before = b"".join(parts)[:corrupt.begin]
    async with journal_stub(server) as stub, aiohttp.ClientSession() as http:
        url = f"{server.http_url}/{journal}"
        for _ in range(2):  # nothing bad was cached by the first attempt
            if over_grpc:
                got: list[pb.ReadResponse] = []
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for resp in stub.Read(pb.ReadRequest(
                            journal=journal, offset=corrupt.begin), timeout=RPC_TIMEOUT):
                        got.append(resp)
                assert err.value.code() == grpc.StatusCode.DATA_LOSS, err.value.details()
                assert f"corrupt fragment {corrupt.path}" in (err.value.details() or "")
                assert got == []
            if over_http:
                async with http.get(f"{url}?offset={corrupt.begin + 7}") as r:
                    text = await r.text()
                    assert r.status == 500, text
                    line = _one_line(text)
                    assert line.startswith("DATA_LOSS: "), line
                    assert f"corrupt fragment {corrupt.path}" in line or (
                        undecodable and f"{journal} at offset {corrupt.begin + 7}" in line
                    ), line

        # A read from before the corrupt fragment gets what precedes it, then the error.
        if corrupt.begin > 0 and over_grpc:
            got = []
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for resp in stub.Read(pb.ReadRequest(journal=journal, offset=0),
                                            timeout=RPC_TIMEOUT):
                    got.append(resp)
            assert err.value.code() == grpc.StatusCode.DATA_LOSS
            assert b"".join(r.content for r in got) == before
        if corrupt.begin > 0 and over_http:
            async with http.get(url) as r:  # 200 is sent: the body is cut short instead
                assert r.status == 200
                body = bytearray()
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for chunk in r.content.iter_any():
                        body += chunk
                assert bytes(body) == before

        # The intact fragments read fine.
        for frag, part in zip(frags, parts, strict=True):
            if frag != corrupt:
                assert await read_all(stub, journal, frag.begin, end_offset=frag.end) == part
    # So does the open spool, and appends go on.
    await assert_still_serving(server, journal, OPEN_SPOOL, begin=frags[-1].end)


async def test_a_corrupt_raw_fragment_is_data_loss(broker: BrokerServer) -> None:
    journal = "bad/input"
    parts = [GOOD, BAD, GOOD]
    frags = await _persist(broker, journal, parts)
    path = _stored(broker, frags[1])
    data = path.read_bytes()
    path.write_bytes(_flip(data, len(data) // 2))  # same length, one byte flipped
    await _assert_data_loss(broker, journal, frags, parts, frags[1])


async def test_a_corrupt_but_decodable_compressed_fragment_is_data_loss(
        broker: BrokerServer) -> None:
    for journal in ("bad/gzip", "bad/snappy"):
        parts = [GOOD, BAD]
        frags = await _persist(broker, journal, parts)
        path = _stored(broker, frags[1])
        content = decompress(frags[1].codec, path.read_bytes())
        assert content == BAD
        # Same length of content, one byte flipped, recompressed: a valid stream.
        path.write_bytes(compress(frags[1].codec, _flip(content, 100)))
        await _assert_data_loss(broker, journal, frags, parts, frags[1])


async def _undecodable(server: BrokerServer, how: str) -> tuple[list[Fragment], list[bytes]]:
    """Two persisted fragments of a GZIP journal, the second one no gzip stream: its
    bytes scrambled (same length), or cut in half."""
    parts = [GOOD, BAD]
    frags = await _persist(server, "bad/gzip", parts)
    path = _stored(server, frags[1])
    data = path.read_bytes()
    assert data[:2] == b"\x1f\x8b"
    if how == "garbage":
        path.write_bytes(bytes(b ^ 0x5A for b in data))
    else:
        path.write_bytes(data[:len(data) // 2])
        with pytest.raises(EOFError):
            gzip.decompress(path.read_bytes())
    return frags, parts


@pytest.mark.parametrize("how", ["garbage", "truncated"])
async def test_an_undecodable_compressed_fragment_is_data_loss_over_http(
        broker: BrokerServer, how: str) -> None:
    frags, parts = await _undecodable(broker, how)
    await _assert_data_loss(broker, "bad/gzip", frags, parts, frags[1], over_grpc=False,
                            undecodable=True)


@pytest.mark.parametrize("how", ["garbage", "truncated"])
async def test_an_undecodable_compressed_fragment_is_data_loss_over_grpc(
        broker: BrokerServer, how: str) -> None:
    frags, parts = await _undecodable(broker, how)
    await _assert_data_loss(broker, "bad/gzip", frags, parts, frags[1], over_http=False)


async def test_a_fresh_broker_reports_a_corrupt_fragment_it_never_held(
        broker: BrokerServer, etcd_server: EmbeddedEtcd, tmp_path: Path) -> None:
    journal = "bad/input"
    parts = [BAD, GOOD]
    frags = await _persist(broker, journal, parts)
    await broker.stop()  # rolls the open spool and persists it too
    path = _stored(broker, frags[0])
    path.write_bytes(_flip(path.read_bytes(), 0))
    fresh = BrokerServer(broker_config(
        etcd_server.endpoint, broker.config.etcd_prefix, tmp_path / "fresh",
        file_root=broker.file_root))
    await fresh.start()
    try:
        async with asyncio.timeout(10):
            await fresh.broker.wait_serving({journal})
        replica = fresh.broker.replicas[journal]
        # It lists the store: the first broker's open spool is a third fragment now.
        frags = [f for f in replica.fragments() if f.backing_store]
        assert [f.size for f in frags] == [len(BAD), len(GOOD), len(OPEN_SPOOL)]
        assert replica.write_head == frags[-1].end
        async with journal_stub(fresh) as stub:
            err = await rpc_error(stub.Read(pb.ReadRequest(journal=journal),
                                            timeout=RPC_TIMEOUT))
            assert err.code() == grpc.StatusCode.DATA_LOSS
            assert f"corrupt fragment {frags[0].path}" in (err.details() or "")
        async with aiohttp.ClientSession() as http, \
                http.get(f"{fresh.http_url}/{journal}") as r:
            assert r.status == 500
            assert _one_line(await r.text()).startswith(
                f"DATA_LOSS: corrupt fragment {frags[0].path}")
        await assert_still_serving(fresh, journal, GOOD + OPEN_SPOOL, begin=frags[1].begin)
    finally:
        await fresh.stop()
