"""TLS and authorization on real brokers (certificates made here with `trustme`, etcd
real): who is refused, with which status and reason, and what is allowed."""

from __future__ import annotations

import asyncio
import datetime
import io
import shutil
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from gazette.auth import Capability, ClientAuth, TLSFiles, open_channel
from gazette.client import BrokerError, JournalClient, RetryPolicy, Unavailable
from gazette.gazctl.__main__ import run_async
from gazette.keyspace import Etcd
from gazette.local.etcd import EmbeddedEtcd
from gazette.pb import broker_pb2 as pb
from gazette.protocol import JournalSpec
from gazette.protocol.trees import SpecChange
from gazette_broker import BrokerServer
from tests.fixtures.broker import broker_config
from tests.fixtures.polling import eventually
from tests.fixtures.security import Pki, keys_file, make_pki, random_key, token

ONCE = RetryPolicy(attempts=1)
SPECS = """

replication: 1
fragment: {stores: ["file:///"]}
children:
  - name: team-a/orders
  - name: team-a/refunds
  - name: team-b/orders
"""
K1, K2 = random_key(), random_key()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


async def started(server: BrokerServer) -> BrokerServer:
    await server.start()
    return server


@pytest.fixture
async def secured(etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path, pki: Pki
                  ) -> AsyncIterator[BrokerServer]:
    """One broker with TLS and authorization (key K1), and the specs applied."""
    tls = pki.issue("broker")
    server = await started(BrokerServer(broker_config(
        etcd_server.endpoint, etcd_prefix, tmp_path, tls_cert_file=tls.cert_file,
        tls_key_file=tls.key_file, tls_ca_file=tls.ca_file,
        auth_keys_file=keys_file(tmp_path / "keys", K1))))
    try:
        await server.apply_yaml(SPECS)
        await eventually(lambda: len(server.broker.replicas) == 3, "journals open", 20)
        yield server
    finally:
        await server.stop()


def client(server: BrokerServer, pki: Pki, tok: str) -> JournalClient:
    return JournalClient(server.grpc_address, retry=ONCE, timeout=10,
                         auth=pki.client(token=tok))


async def refusal(server: BrokerServer, pki: Pki, tok: str, journal: str = "team-a/orders",
                  op: str = "append") -> BrokerError:
    async with client(server, pki, tok) as c:
        with pytest.raises(BrokerError) as err:
            if op == "append":
                await c.append(journal, b"x\n")
            else:
                async for _ in c.read(journal):
                    pass
    return err.value


# -- TLS ---------------------------------------------------------------------------


async def test_tls_client_without_the_ca_is_refused(secured: BrokerServer, pki: Pki) -> None:
    ok = token(K1, Capability.LIST)
    async with client(secured, pki, ok) as c:
        assert [j.spec.name for j in (await c.list()).journals] == [
            "team-a/orders", "team-a/refunds", "team-b/orders"]
    # The system's CAs do not know ours: the handshake fails.
    async with JournalClient(secured.grpc_address, retry=ONCE, timeout=5,
                             auth=ClientAuth(TLSFiles(), ok)) as c:
        with pytest.raises(Unavailable):
            await c.list()
    # Plain text to a TLS port is not served either.
    async with JournalClient(secured.grpc_address, retry=ONCE, timeout=5,
                             auth=ClientAuth(token=ok)) as c:
        with pytest.raises(Unavailable):
            await c.list()
    assert secured.endpoint.startswith("https://")


async def test_a_list_of_addresses_is_verified_against_its_first_host(
        secured: BrokerServer, pki: Pki) -> None:
    # grpc took "127.0.0.1:p,127.0.0.1:p" for one host name and refused the certificate
    # ("Hostname Verification Check failed"): the fault suites' clients caught it.
    target = f"ipv4:{secured.grpc_address},{secured.grpc_address}"
    async with JournalClient(target, retry=ONCE, timeout=10,
                             auth=pki.client(token=token(K1, Capability.LIST))) as c:
        assert len((await c.list()).journals) == 3


async def test_mtls_without_a_client_certificate_is_refused(
        etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path, pki: Pki) -> None:
    tls = pki.issue("broker")
    server = await started(BrokerServer(broker_config(
        etcd_server.endpoint, etcd_prefix, tmp_path, tls_cert_file=tls.cert_file,
        tls_key_file=tls.key_file, tls_ca_file=tls.ca_file, tls_client_auth=True)))
    try:
        async with JournalClient(server.grpc_address, retry=ONCE, timeout=5,
                                 auth=pki.client()) as c:
            with pytest.raises(Unavailable):
                await c.list()
        stranger = make_pki(tmp_path / "other").issue("client")  # another CA's cert
        async with JournalClient(server.grpc_address, retry=ONCE, timeout=5,
                                 auth=ClientAuth(TLSFiles(stranger.cert_file,
                                                          stranger.key_file, pki.ca_file))
                                 ) as c:
            with pytest.raises(Unavailable):
                await c.list()
        async with JournalClient(server.grpc_address, retry=ONCE, timeout=5,
                                 auth=pki.client(pki.issue("client"))) as c:
            assert (await c.list()).journals == []
        # The HTTP port asks for a client certificate too.
        ctx = ssl.create_default_context(cafile=pki.ca_file)
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            async with aiohttp.ClientSession() as http, http.get(
                    f"https://127.0.0.1:{server.http_port}/healthz", ssl=ctx) as resp:
                await resp.read()
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
        async with aiohttp.ClientSession() as http, http.get(
                f"https://127.0.0.1:{server.http_port}/healthz", ssl=ctx) as resp:
            assert resp.status == 200
    finally:
        await server.stop()


def _peer_serial(port: int, ca_file: str) -> int:
    ctx = ssl.create_default_context(cafile=ca_file)
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_a_certificate_rotated_on_disk_is_served_without_a_restart(
        etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path, pki: Pki) -> None:
    # The certificate expires in an hour; cert-manager renews it in place.
    tls = pki.issue("broker", "127.0.0.1", "localhost", not_after=datetime.datetime.now(
        datetime.UTC) + datetime.timedelta(hours=1))
    server = await started(BrokerServer(broker_config(
        etcd_server.endpoint, etcd_prefix, tmp_path, tls_cert_file=tls.cert_file,
        tls_key_file=tls.key_file, tls_ca_file=tls.ca_file)))
    try:
        before = await asyncio.to_thread(_peer_serial, server.http_port, pki.ca_file)
        # A second CA takes over: clients that trust only it are refused until the
        # broker serves the new certificate.
        new_ca = make_pki(tmp_path / "ca2")
        new_ca_client = JournalClient(server.grpc_address, retry=ONCE, timeout=5,
                                      auth=new_ca.client())
        async with new_ca_client as c:
            with pytest.raises(Unavailable):
                await c.list()
        fresh = new_ca.issue("fresh")
        await asyncio.to_thread(shutil.copyfile, fresh.cert_file, tls.cert_file)
        await asyncio.to_thread(shutil.copyfile, fresh.key_file, tls.key_file)
        after = await asyncio.to_thread(_peer_serial, server.http_port, new_ca.ca_file)
        assert after != before
        async with JournalClient(server.grpc_address, retry=ONCE, timeout=5,
                                 auth=new_ca.client()) as c:
            assert (await c.list()).journals == []
    finally:
        await server.stop()


async def test_etcd_over_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    etcd_tls = pki.issue("etcd")
    with EmbeddedEtcd(tmp_path / "etcd", tls=etcd_tls) as etcd_server:
        assert etcd_server.endpoint.startswith("https://")
        async with Etcd(etcd_server.endpoint, tls=pki.issue("etcd-client")) as etcd:
            await etcd.put("/k", b"v")
            assert (await etcd.get_prefix("/k")).kvs[0].value == b"v"
        no_cert = Etcd(etcd_server.endpoint, timeout=3, tls=TLSFiles(ca_file=pki.ca_file))
        async with no_cert:
            with pytest.raises(Exception, match="etcd"):
                await no_cert.put("/k", b"w")


# -- tokens --------------------------------------------------------------------------


async def test_bad_tokens_are_unauthenticated_with_the_reason(
        secured: BrokerServer, pki: Pki) -> None:
    none = await refusal(secured, pki, "")
    assert none.status == "UNAUTHENTICATED" and "no token" in none.detail
    expired = token(K1, Capability.APPEND, ttl=60, now=time.time() - 3600)
    err = await refusal(secured, pki, expired)
    assert err.status == "UNAUTHENTICATED" and "expired" in err.detail
    forged = token(random_key(), Capability.APPEND)
    err = await refusal(secured, pki, forged)
    assert err.status == "UNAUTHENTICATED" and "signature" in err.detail
    err = await refusal(secured, pki, "not.a.jwt")
    assert err.status == "UNAUTHENTICATED"


async def test_scope_and_capabilities_are_permission_denied_with_the_reason(
        secured: BrokerServer, pki: Pki) -> None:
    team_a = token(K1, Capability.APPEND, Capability.READ, selector="prefix=team-a/",
                   subject="team-a")
    err = await refusal(secured, pki, team_a, "team-b/orders")
    assert err.status == "PERMISSION_DENIED" and "team-b/orders" in err.detail \
        and "prefix=team-a/" in err.detail
    err = await refusal(secured, pki, team_a, "team-b/orders", op="read")
    assert err.status == "PERMISSION_DENIED"
    reader = token(K1, Capability.READ)
    err = await refusal(secured, pki, reader)
    assert err.status == "PERMISSION_DENIED" and "'append' capability" in err.detail
    async with client(secured, pki, team_a) as c:
        commit = (await c.append("team-a/orders", b"hello\n")).commit
        assert commit.end - commit.begin == 6
        with pytest.raises(BrokerError) as denied:
            await c.list()  # no LIST capability
        assert denied.value.status == "PERMISSION_DENIED"
        with pytest.raises(BrokerError) as denied:
            await c.apply(new("team-a/new"))
        assert denied.value.status == "PERMISSION_DENIED"


def new(name: str) -> list[SpecChange[JournalSpec]]:
    return [SpecChange(name, 0, JournalSpec(name, replication=1))]


async def test_a_prefix_token_lists_only_its_journals_and_applies_only_there(
        secured: BrokerServer, pki: Pki) -> None:
    team_a = token(K1, Capability.LIST, Capability.APPLY, selector="prefix=team-a/")
    async with client(secured, pki, team_a) as c:
        assert [j.spec.name for j in (await c.list()).journals] == [
            "team-a/orders", "team-a/refunds"]
        assert [j.spec.name for j in (await c.list("prefix=team-b/")).journals] == []
        await c.apply(new("team-a/new"))
        with pytest.raises(BrokerError) as denied:
            await c.apply(new("team-b/new"))
        assert denied.value.status == "PERMISSION_DENIED"
    everyone = token(K1, Capability.LIST)
    async with client(secured, pki, everyone) as c:
        assert "team-b/new" not in [j.spec.name for j in (await c.list()).journals]


async def test_http_gateway_answers_401_and_403_with_the_reason(
        secured: BrokerServer, pki: Pki) -> None:
    url = f"https://127.0.0.1:{secured.http_port}"
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    team_a = token(K1, Capability.APPEND, Capability.READ, selector="prefix=team-a/")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/healthz", ssl=ctx) as resp:
            assert resp.status == 200  # probes carry no token
        async with http.put(f"{url}/team-a/orders", data=b"x\n", ssl=ctx) as resp:
            assert resp.status == 401 and "no token" in await resp.text()
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        bearer = {"Authorization": f"Bearer {team_a}"}
        async with http.put(f"{url}/team-b/orders", data=b"x\n", ssl=ctx,
                            headers=bearer) as resp:
            assert resp.status == 403 and "prefix=team-a/" in await resp.text()
        async with http.put(f"{url}/team-a/orders", data=b"x\n", ssl=ctx,
                            headers=bearer) as resp:
            assert resp.status == 204, await resp.text()
        async with http.get(f"{url}/team-a/orders", ssl=ctx, headers=bearer) as resp:
            assert resp.status == 200 and await resp.read() == b"x\n"
        reader = {"Authorization": f"Bearer {token(K1, Capability.READ)}"}
        async with http.put(f"{url}/team-a/orders", data=b"x\n", ssl=ctx,
                            headers=reader) as resp:
            assert resp.status == 403 and "'append' capability" in await resp.text()


async def test_only_the_ops_routes_are_open_not_their_paths(
        secured: BrokerServer, pki: Pki) -> None:
    """GET (and HEAD) /healthz and /metrics need no token; any other method on those
    paths is a journal request like any other (journals may be named so): 401 without a
    token, and nothing is appended."""
    await secured.apply_yaml("replication: 1\nfragment: {stores: [\"file:///\"]}\n"
                             "children: [{name: healthz}, {name: metrics}]\n")
    await eventually(lambda: {"healthz", "metrics"} <= set(secured.broker.replicas),
                     "the journals healthz and metrics open", 20)
    url = f"https://127.0.0.1:{secured.http_port}"
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    async with aiohttp.ClientSession() as http:
        for path in ("healthz", "metrics"):
            for method in ("GET", "HEAD"):
                async with http.request(method, f"{url}/{path}", ssl=ctx) as resp:
                    assert resp.status == 200, (method, path, resp.status)
            for method in ("PUT", "POST"):
                async with http.request(method, f"{url}/{path}", data=b"sneaked in\n",
                                        ssl=ctx) as resp:
                    assert resp.status == 401, (method, path, resp.status,
                                                await resp.text())
                    assert "no token" in await resp.text()
            assert secured.broker.replicas[path].write_head == 0, f"{path} was appended to"
        # With a token that grants it, the journal is appended to as any other.
        bearer = {"Authorization": f"Bearer {token(K1, Capability.APPEND)}"}
        async with http.put(f"{url}/healthz", data=b"x\n", ssl=ctx, headers=bearer) as resp:
            assert resp.status == 204, await resp.text()
        # A method no route takes: 401 without a token, 405 with one (it was a 500).
        async with http.delete(f"{url}/team-a/orders", ssl=ctx) as resp:
            assert resp.status == 401, (resp.status, await resp.text())
        async with http.delete(f"{url}/team-a/orders", ssl=ctx, headers=bearer) as resp:
            assert resp.status == 405, (resp.status, await resp.text())


# -- forwarding and peers ---------------------------------------------------------------


async def test_a_forwarded_request_carries_the_callers_authority(
        etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path, pki: Pki) -> None:
    """Broker A (no journals) knows keys K2 and K1; broker B, which serves the journals,
    only K2. A token A accepts but B does not is refused by B through A; one both accept
    appends through A, which its own token (REPLICATE only) could not."""
    tls = pki.issue("broker")
    common = dict(tls_cert_file=tls.cert_file, tls_key_file=tls.key_file,
                  tls_ca_file=tls.ca_file)
    b = await started(BrokerServer(broker_config(
        etcd_server.endpoint, etcd_prefix, tmp_path, suffix="b", spool_dir=tmp_path / "sb",
        auth_keys_file=keys_file(tmp_path / "kb", K2), **common)))
    a = await started(BrokerServer(broker_config(
        etcd_server.endpoint, etcd_prefix, tmp_path, suffix="a", spool_dir=tmp_path / "sa",
        journal_limit=0, auth_keys_file=keys_file(tmp_path / "ka", K2, K1), **common)))
    try:
        await b.apply_yaml(SPECS)
        await eventually(lambda: len(b.broker.replicas) == 3, "journals open on B", 20)
        assert not a.broker.replicas
        only_a = token(K1, Capability.APPEND, Capability.READ, subject="only-a")
        err = await refusal(a, pki, only_a)
        assert err.status == "UNAUTHENTICATED" and "via" in err.detail
        both = token(K2, Capability.APPEND, Capability.READ, selector="prefix=team-a/")
        async with client(a, pki, both) as c:
            commit = (await c.append("team-a/orders", b"forwarded\n")).commit
            assert commit.end == 10
            chunks = [ch.content async for ch in c.read("team-a/orders")]
            assert b"".join(chunks) == b"forwarded\n"
        err = await refusal(a, pki, both, "team-b/orders")
        assert err.status == "PERMISSION_DENIED"
        # Through A's HTTP gateway, too, with the caller's token.
        ctx = ssl.create_default_context(cafile=pki.ca_file)
        async with aiohttp.ClientSession() as http:
            async with http.put(f"https://127.0.0.1:{a.http_port}/team-a/refunds",
                                data=b"y\n", ssl=ctx,
                                headers={"Authorization": f"Bearer {both}"}) as resp:
                assert resp.status == 204, await resp.text()
            async with http.put(f"https://127.0.0.1:{a.http_port}/team-a/refunds",
                                data=b"y\n", ssl=ctx,
                                headers={"Authorization": f"Bearer {only_a}"}) as resp:
                assert resp.status == 401, await resp.text()
    finally:
        await a.stop()
        await b.stop()


async def test_peers_replicate_with_their_own_capability(
        etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path, pki: Pki) -> None:
    tls = pki.issue("broker")
    keys = keys_file(tmp_path / "keys", K1)
    servers = [await started(BrokerServer(broker_config(
        etcd_server.endpoint, etcd_prefix, tmp_path, suffix=f"b{i}",
        spool_dir=tmp_path / f"s{i}", tls_cert_file=tls.cert_file,
        tls_key_file=tls.key_file, tls_ca_file=tls.ca_file, tls_client_auth=True,
        auth_keys_file=keys))) for i in range(2)]
    try:
        await servers[0].apply_yaml("name: shared/log\nreplication: 2\n"
                                    "fragment: {stores: ['file:///']}\n")
        await eventually(lambda: all("shared/log" in s.broker.replicas for s in servers),
                         "both brokers hold the journal", 20)
        writer = token(K1, Capability.APPEND)
        async with JournalClient(servers[0].grpc_address, timeout=10,
                                 auth=pki.client(pki.issue("client"), writer)) as c:
            commit = (await c.append("shared/log", b"replicated\n")).commit
        assert commit.end == 11
        for s in servers:
            await eventually(lambda s=s: s.broker.replicas["shared/log"].write_head == 11,
                             "each replica has it", 10)
        # A caller's token without REPLICATE cannot pose as a peer.
        auth = pki.client(pki.issue("client"), writer)
        async with open_channel(servers[0].grpc_address, [], auth) as channel:
            call = channel.stream_stream("/gazette.broker.Journal/Replicate",
                                         request_serializer=pb.ReplicateRequest.SerializeToString,
                                         response_deserializer=pb.ReplicateResponse.FromString)
            stream = call(iter([pb.ReplicateRequest(journal="shared/log")]))
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await stream.read()
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'replicate' capability" in (denied.value.details() or "")
    finally:
        for s in servers:
            await s.stop()


# -- gazctl ---------------------------------------------------------------------------


async def _gazctl(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    code = await run_async(list(args), stdin=io.BytesIO(b""), stdout=out, stderr=err,
                           env=env or {})
    return code, out.getvalue().decode(), err.getvalue()


async def test_gazctl_issues_tokens_and_uses_them(secured: BrokerServer, pki: Pki,
                                                  tmp_path: Path) -> None:
    keys = keys_file(tmp_path / "issuer-keys", K1)
    code, token_text, err = await _gazctl(
        "auth", "issue", "--keys-file", keys, "--subject", "team-a",
        "--capability", "list,append", "--selector", "prefix=team-a/", "--ttl", "1h")
    assert code == 0 and "team-a" in err and "prefix=team-a/" in err, err
    tok = token_text.strip()
    address = ["--broker", secured.grpc_address, "--tls.ca-file", pki.ca_file]
    code, out, err = await _gazctl("journals", "list", *address, "--auth.token", tok)
    assert code == 0, err
    assert "team-a/orders" in out and "team-b/orders" not in out
    code, out, err = await _gazctl("journals", "list", *address,
                                   env={"AUTH_TOKEN": token(K1, Capability.READ)})
    assert code == 1 and "PERMISSION_DENIED" in err and "'list' capability" in err, err
    code, _, err = await _gazctl("auth", "issue", "--keys-file", keys, "--subject", "x",
                                 "--capability", "fly")
    assert code == 2  # the usage error (argparse's, on the process's stderr)
    code, _, err = await _gazctl("auth", "issue", "--keys-file", str(tmp_path / "none"),
                                 "--subject", "x", "--capability", "read")
    assert code == 2 and "cannot read" in err, err  # a bad flag value
    code, _, err = await _gazctl("journals", "list", *address, "--auth.token", "two words")
    assert code == 2 and "auth.token" in err, err


async def test_a_keys_file_that_is_not_text_is_one_line_naming_it(tmp_path: Path) -> None:
    """Random bytes put in the keys file (not their base64): gazctl and gazette serve say
    which file and what it should hold, exit 2, no traceback."""
    keys = tmp_path / "keys"
    keys.write_bytes(b"\x00\xff\xfe" + random_key())
    expected = (f"{keys} is not text (byte 1 is not ASCII): expected base64 keys separated "
                "by whitespace or commas, e.g. the output of `head -c 32 /dev/urandom | "
                "base64`")
    code, _, err = await _gazctl("auth", "issue", "--keys-file", str(keys), "--subject", "x",
                                 "--capability", "read")
    assert (code, err) == (2, f"gazctl: --keys-file: {expected}\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette_broker", "serve", "--auth.keys-file", str(keys),
        "--log.level", "error", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    _, raw = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, raw.decode()
    assert raw.decode() == f"gazette serve: auth.keys-file: {expected}\n"


async def first_bytes_sent_to(address: str, *gazctl_args: str) -> bytes:
    """What gazctl sends first to a listener that answers nothing (address: its
    host:port with the scheme to test, ``{}`` for host:port)."""
    got = bytearray()

    async def take(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.extend(await reader.read(64))
        writer.close()

    server = await asyncio.start_server(take, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        code, _, err = await _gazctl("journals", "list", "--broker",
                                     address.format(f"127.0.0.1:{port}"), *gazctl_args)
    assert code == 1, err
    return bytes(got)


async def test_gazctl_honours_an_https_address(
        secured: BrokerServer, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """https:// is TLS (verified with --tls.ca-file, else the system's CAs), never plain
    text with the token in clear; http:// with TLS files is refused."""
    ok = ["--auth.token", token(K1, Capability.LIST)]
    monkeypatch.setenv("SSL_CERT_FILE", pki.ca_file)  # the system's CAs: ours
    code, out, err = await _gazctl("journals", "list", "--broker",
                                   f"https://{secured.grpc_address}", *ok)
    assert code == 0 and "team-a/orders" in out, err
    # What goes on the wire first: a TLS handshake record, not HTTP/2 in clear.
    assert (await first_bytes_sent_to("https://{}", *ok))[:1] == b"\x16"
    assert (await first_bytes_sent_to("{}", *ok)).startswith(b"PRI * HTTP/2.0")
    monkeypatch.delenv("SSL_CERT_FILE")
    code, out, err = await _gazctl("journals", "list", "--broker",
                                   f"grpcs://{secured.grpc_address}", "--tls.ca-file",
                                   pki.ca_file, *ok)
    assert code == 0 and "team-a/orders" in out, err
    plain = f"http://{secured.grpc_address}"
    code, _, err = await _gazctl("journals", "list", "--broker", plain, "--tls.ca-file",
                                 pki.ca_file, *ok)
    assert (code, err) == (2, f"gazctl: broker address from --broker: {plain!r} is plain "
                              "text (http://), but TLS files are given: name it https:// "
                              "(or host:port)\n")
    code, _, err = await _gazctl("shards", "list", "--consumer.address", "grpc://c:1",
                                 env={"TLS_CA_FILE": pki.ca_file})
    assert code == 2 and "consumer address from --consumer.address: 'grpc://c:1' is " \
        "plain text (grpc://)" in err, err


@pytest.mark.parametrize(("flags", "says"), [
    (["--tls.cert-file", "/nonexistent/cert.pem", "--tls.key-file", "/nonexistent/k.pem"],
     "tls.cert-file: /nonexistent/cert.pem is not a readable file"),
    (["--tls.ca-file", __file__], "TLS is all or nothing"),
    (["--auth.keys-file", "/nonexistent/keys"], "auth.keys-file: cannot read"),
])
async def test_serve_refuses_bad_security_flags_naming_them(flags: list[str], says: str
                                                             ) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette_broker", "serve", *flags,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and says in err.decode(), err.decode()
