"""What ``gazctl journals apply`` and ``gazctl shards apply`` refuse before applying:
a journal whose stores no registered broker serves (read from etcd's member specs, with
``--etcd.address`` or $ETCD_ADDRESS), unless ``--allow-unserved-stores``; a shard whose
source journal does not exist (asked of the broker), unless ``--allow-missing-journals``.
Real brokers (one serving only ``s3://``), a real consumer member, a real etcd."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gazette.client import JournalClient
from gazette.consumer.member import ConsumerMember
from gazette.local.etcd import EmbeddedEtcd
from gazette_broker import BrokerServer
from tests.fixtures.broker import broker_config
from tests.integration.gazctl.test_gazctl_shards import gazctl, listed, one_error_line

pytestmark = pytest.mark.integration

FILES = "name: files/journal\nreplication: 1\nfragment: {stores: ['file:///']}\n"
S3 = "name: s3/journal\nreplication: 1\nfragment: {stores: ['s3://bucket/']}\n"


@pytest.fixture
async def s3_broker(etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path
                    ) -> AsyncIterator[BrokerServer]:
    """A broker without a file root: it serves s3:// stores only."""
    server = BrokerServer(broker_config(etcd_server.endpoint, etcd_prefix, tmp_path,
                                        file_root=None))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def journal_names(broker: BrokerServer) -> list[str]:
    async with JournalClient(broker.grpc_address) as client:
        return [j.spec.name for j in (await client.list()).journals]


async def test_journals_apply_refuses_stores_no_broker_serves(
        s3_broker: BrokerServer, etcd_server: EmbeddedEtcd, etcd_prefix: str) -> None:
    assert s3_broker.store_schemes == ("s3",)
    etcd = ["--etcd.address", etcd_server.endpoint, "--etcd.prefix", etcd_prefix]
    code, _, err = await gazctl(None, "journals", "apply", *etcd, broker=s3_broker,
                                stdin=FILES.encode())
    assert code == 1
    assert one_error_line(err) == (
        "gazctl: not applied: journal files/journal: no broker serves its file:// stores "
        "(the 1 registered broker serves s3://); start a broker that serves them, or pass "
        "--allow-unserved-stores")
    assert await journal_names(s3_broker) == []
    # Etcd's address from the environment: the same.
    env = {"ETCD_ADDRESS": etcd_server.endpoint, "ETCD_PREFIX": etcd_prefix}
    code, _, err = await gazctl(None, "journals", "apply", broker=s3_broker,
                                stdin=FILES.encode(), env=env)
    assert code == 1 and "journal files/journal: no broker serves its file://" in err
    # A journal it serves passes the check; the apply itself then fails, at a broker
    # address of nowhere (applied, an s3:// journal of no real bucket would keep the
    # s3 broker from draining at the end).
    code, _, err = await gazctl(None, "journals", "apply", broker=s3_broker,
                                stdin=S3.encode(), env={**env, "BROKER_ADDRESS": "127.0.0.1:1"})
    assert code == 1 and "no broker serves" not in err, err  # checked, then unreachable
    # Allowed: applied, and the broker says it will not be assigned.
    code, _, err = await gazctl(None, "journals", "apply", *etcd, "--allow-unserved-stores",
                                broker=s3_broker, stdin=FILES.encode())
    assert code == 0, err
    assert "files/journal: no broker can serve its stores" in err
    assert await journal_names(s3_broker) == ["files/journal"]


async def test_journals_apply_with_no_broker_registered_checks_nothing(
        broker_server: BrokerServer, etcd_server: EmbeddedEtcd) -> None:
    """An etcd prefix where no broker is registered yet: nothing to check against."""
    code, _, err = await gazctl(None, "journals", "apply", "--etcd.address",
                                etcd_server.endpoint, "--etcd.prefix", "/nobody/here",
                                broker=broker_server, stdin=FILES.encode())
    assert code == 0, err
    assert "no broker is registered yet: the journals' stores are not checked" in err


async def test_shards_apply_refuses_a_source_journal_that_does_not_exist(
        member: ConsumerMember, broker: BrokerServer) -> None:
    specs = ("id: checked/\nchildren:\n"
             "  - id: checked/ok\n    sources: [{journal: counts/in-0}]\n"
             "  - id: checked/lost\n    sources: [{journal: no/such-journal}]\n"
             "    disable: true\n")
    code, _, err = await gazctl(member, "shards", "apply", broker=broker,
                                stdin=specs.encode())
    assert code == 1
    assert one_error_line(err) == (
        "gazctl: not applied: shard checked/lost: source journal no/such-journal does not "
        "exist; apply the journals first, or pass --allow-missing-journals if they are "
        "applied later")
    assert await listed(member, "prefix=checked/") == []
    code, _, err = await gazctl(member, "shards", "apply", "--allow-missing-journals",
                                broker=broker, stdin=specs.encode())
    assert code == 0, err
    assert [s["id"] for s in await listed(member, "prefix=checked/")] == [
        "checked/lost", "checked/ok"]


async def test_shards_apply_says_when_the_broker_cannot_be_asked(
        member: ConsumerMember) -> None:
    from tests.fixtures.procs import free_port

    specs = "id: alone/a\nsources: [{journal: counts/in-0}]\n"
    code, _, err = await gazctl(member, "shards", "apply", stdin=specs.encode(),
                                env={"BROKER_ADDRESS": f"127.0.0.1:{free_port()}"})
    assert code == 1
    line = one_error_line(err)
    assert line.startswith("gazctl: cannot check the shards' source journals at the broker")
    assert line.endswith("pass --allow-missing-journals to apply without checking")
