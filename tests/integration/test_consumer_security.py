"""A consumer member with mutual TLS and authorization on, called through `ShardClient`
with tokens: each Shard RPC needs its capability, a token limited by a selector sees and
reaches only its shards, and a call without a token is refused. The member itself reads
its journals from a TLS broker with its own token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gazette.auth import Capability, ClientAuth, TLSFiles
from gazette.client import RetryPolicy, ShardClient
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.errors import GazetteError
from gazette.local.etcd import EmbeddedEtcd
from gazette.protocol import ShardSource, ShardSpec, SpecChange
from gazette_broker import BrokerServer
from tests.fixtures.broker import broker_config
from tests.fixtures.consumer import INPUTS, SHARDS, Stores, primaries
from tests.fixtures.polling import eventually
from tests.fixtures.security import ClusterSecurity

pytestmark = pytest.mark.integration

ONCE = RetryPolicy(attempts=1)


@pytest.fixture
async def secure_member(tmp_path: Path, etcd_prefix: str, consumer_root: str
                        ) -> AsyncIterator[tuple[ConsumerMember, ClusterSecurity]]:
    """etcd, a broker and a member of app "counter", all with mutual TLS and tokens."""
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
            drain_timeout=5, grace=1, **security.config()), Stores().app())
        await member.start()
        yield member, security
    finally:
        if member is not None:
            await member.stop()
        if broker is not None:
            await broker.stop()
        await asyncio.to_thread(etcd.stop)


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
