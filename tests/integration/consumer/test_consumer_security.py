"""A consumer member with mutual TLS and authorization on, called through `ShardClient`
with tokens: each Shard RPC needs its capability, a token limited by a selector sees and
reaches only its shards, and a call without a token is refused. The member itself reads
its journals from a TLS broker with its own token."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from gazette.auth import Capability, ClientAuth, TLSFiles, open_channel
from gazette.client import JournalClient, RetryPolicy, ShardClient
from gazette.consumer import Application
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.errors import GazetteError
from gazette.local.etcd import EmbeddedEtcd
from gazette.protocol import ShardSource, ShardSpec, SpecChange
from gazette_broker import BrokerServer
from tests.fixtures.broker import broker_config
from tests.fixtures.consumer import INPUTS, SHARDS, Stores, primaries, publish
from tests.fixtures.member_app import TOTAL_PATH, RoutedSums
from tests.fixtures.polling import eventually
from tests.fixtures.security import ClusterSecurity

pytestmark = pytest.mark.integration

ONCE = RetryPolicy(attempts=1)


@contextlib.asynccontextmanager
async def secure_cluster(tmp_path: Path, etcd_prefix: str, consumer_root: str,
                         app: Application
                         ) -> AsyncIterator[tuple[ConsumerMember, ClusterSecurity]]:
    """etcd, a broker and a member of app "counter" running `app`, all with mutual TLS
    and tokens."""
    security = ClusterSecurity.make(tmp_path / "pki")
    etcd = EmbeddedEtcd(tmp_path / "etcd", tls=security.etcd_tls)
    await asyncio.to_thread(etcd.start)
    broker = member = None
    try:
        broker = BrokerServer(broker_config(etcd.endpoint, etcd_prefix, tmp_path,
                                            **security.config()))
        await broker.start()
        await broker.apply_yaml(INPUTS)
        member = ConsumerMember(MemberConfig(
            "counter", zone="zone-a", suffix="m0", host="127.0.0.1", bind="127.0.0.1",
            port=0, http_port=0, broker_address=broker.grpc_address,
            etcd_address=etcd.endpoint, etcd_root=consumer_root, lease_ttl=5,
            drain_timeout=5, grace=1, **security.config()), app)
        await member.start()
        yield member, security
    finally:
        if member is not None:
            await member.stop()
        if broker is not None:
            await broker.stop()
        await asyncio.to_thread(etcd.stop)


@pytest.fixture
async def secure_member(tmp_path: Path, etcd_prefix: str, consumer_root: str
                        ) -> AsyncIterator[tuple[ConsumerMember, ClusterSecurity]]:
    """`secure_cluster` of the counting app."""
    async with secure_cluster(tmp_path, etcd_prefix, consumer_root,
                              Stores().app()) as out:
        yield out


def shard_client(member: ConsumerMember, auth: ClientAuth) -> ShardClient:
    return ShardClient(member.endpoint, retry=ONCE, timeout=10, auth=auth)


async def test_shard_rpcs_are_authorized_per_capability_and_shard(
        secure_member: tuple[ConsumerMember, ClusterSecurity]) -> None:
    member, security = secure_member
    changes = [SpecChange(s, 0, ShardSpec(s, (ShardSource(f"counts/in-{i}"),)))
               for i, s in enumerate(SHARDS)]
    # Apply needs shard-apply: a token of every other capability is refused.
    others = [c for c in Capability if c is not Capability.SHARD_APPLY]
    async with shard_client(member, security.client(*others)) as c:
        with pytest.raises(GazetteError, match=r"PERMISSION_DENIED.*shard-apply"):
            await c.apply(changes)
    async with shard_client(member, security.client()) as admin:
        await admin.apply(changes)
        assert [s.spec.id for s in await admin.list()] == SHARDS
    # The member runs them, reading its journals from the TLS broker with its own token.
    await eventually(lambda: len(primaries([member])) == 4, "every shard runs", 30)

    # A token for shard-0 alone lists only it, and reaches only it.
    scoped = security.client(Capability.SHARD_LIST, Capability.SHARD_READ,
                             selector="id=shard-0")
    async with shard_client(member, scoped) as c:
        assert [s.spec.id for s in await c.list()] == ["shard-0"]
        stat = await c.stat("shard-0")
        assert stat is not None
        with pytest.raises(GazetteError, match=r"PERMISSION_DENIED.*shard-1"):
            await c.stat("shard-1")
        with pytest.raises(GazetteError, match=r"PERMISSION_DENIED.*shard-1"):
            await c.get_hints("shard-1")
    # A certificate but no token: UNAUTHENTICATED, saying so.
    no_token = ClientAuth(TLSFiles(security.cert.cert_file, security.cert.key_file,
                                   security.pki.ca_file))
    async with shard_client(member, no_token) as c:
        with pytest.raises(GazetteError, match="UNAUTHENTICATED"):
            await c.list()


async def test_application_http_routes_need_a_token_as_the_gateway_does(
        tmp_path: Path, etcd_prefix: str, consumer_root: str) -> None:
    """An application's HTTP route on the shard's own primary is answered from its live
    store only for a token granting shard-call over that shard: 401 without a token, 403
    for one without the capability or limited to other shards, each with the reason.
    /healthz and /metrics stay open to GET, and only to GET."""
    async with secure_cluster(tmp_path, etcd_prefix, consumer_root, RoutedSums()) as (
            member, security):
        changes = [SpecChange(s, 0, ShardSpec(s, (ShardSource(f"counts/in-{i}"),)))
                   for i, s in enumerate(SHARDS)]
        async with shard_client(member, security.client()) as admin:
            await admin.apply(changes)
        await eventually(lambda: len(primaries([member])) == 4, "every shard runs", 30)
        async with JournalClient(member.config.broker_address, retry=ONCE,
                                 auth=security.client(Capability.APPEND)) as journals:
            await publish(journals, 4)  # one {"key": "k", "n": 1} per shard

        url = f"{member.http_url}/sums/k?shard=shard-0"
        body = json.dumps({"shard": "shard-0", "key": "k"}).encode()

        def bearer(*capabilities: Capability, selector: str = "") -> dict[str, str]:
            tok = security.client(*capabilities, selector=selector).token
            return {"Authorization": f"Bearer {tok}"}

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                ssl=security.cert.client_context())) as http:

            async def total() -> bool:
                async with http.get(url, headers=bearer(Capability.SHARD_CALL)) as r:
                    return r.status == 200 and (await r.json())["total"] == 1

            await eventually(total, "shard-0 counted its message", 30)
            async with http.post(f"{member.http_url}/sums", data=body,
                                 headers=bearer(Capability.SHARD_CALL,
                                                selector="id=shard-0")) as r:
                assert r.status == 200 and (await r.json())["total"] == 1

            for method, target in (("GET", url), ("POST", f"{member.http_url}/sums")):
                async with http.request(method, target, data=body) as r:
                    assert r.status == 401, (method, r.status, await r.text())
                    assert "no token" in await r.text()
                    assert r.headers["WWW-Authenticate"].startswith("Bearer")
                others = [c for c in Capability if c is not Capability.SHARD_CALL]
                async with http.request(method, target, data=body,
                                        headers=bearer(*others)) as r:
                    assert r.status == 403 and "'shard-call' capability" in await r.text()
                async with http.request(method, target, data=body, headers=bearer(
                        Capability.SHARD_CALL, selector="id=shard-1")) as r:
                    text = await r.text()
                    assert r.status == 403 and "shard shard-0" in text \
                        and "id=shard-1" in text, (r.status, text)
            for path in ("healthz", "metrics"):
                async with http.get(f"{member.http_url}/{path}") as r:
                    assert r.status == 200, (path, r.status)
                async with http.put(f"{member.http_url}/{path}", data=b"x") as r:
                    assert r.status == 401, (path, r.status)

        # The same method over gRPC: the same refusals.
        async with open_channel(member.endpoint.removeprefix("https://"), (),
                                security.client(Capability.SHARD_CALL,
                                                selector="id=shard-1")) as channel:
            call = channel.unary_unary(TOTAL_PATH)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(body, timeout=10)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
