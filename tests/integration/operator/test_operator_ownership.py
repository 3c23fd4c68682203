"""The operator's resources each own their spec in etcd, against an emulated Kubernetes
API (kmock) and a real etcd: two resources naming one journal do not overwrite each
other (the second is refused and names the owner, even with two operator replicas
acting at once), deleting either removes only what it owns, a renamed journal or a
shard moved to another app leaves no orphan, a delete finds the key from the spec when
the status never recorded it, and a resource that becomes invalid says so, also at its
drift checks."""

from __future__ import annotations

from typing import Any

import pytest

from gazette.keyspace import Etcd
from gazette.local.etcd import EmbeddedEtcd
from gazette_operator.sync import JOURNAL_KIND, declared
from tests.fixtures.kube import Emulator
from tests.fixtures.polling import eventually
from tests.integration.operator.test_operator import (
    call,
    condition,
    create,
    events,
    example,
    obj,
    running_operator,
    running_operators,
    spec_in_etcd,
    status,
    url,
)

pytestmark = pytest.mark.integration

MERGE = {"Content-Type": "application/merge-patch+json"}


def journal(name: str, replication: int, journal_name: str = "example/journal"
            ) -> dict[str, Any]:
    resource = example()
    resource["metadata"]["name"] = name
    resource["spec"].update(name=journal_name, replication=replication)
    resource["spec"]["fragment"]["stores"] = ["file:///"]
    return resource


async def replication(etcd: Etcd, key: str) -> int | None:
    spec = await spec_in_etcd(etcd, key)
    return None if spec is None else int(spec.replication)


async def delete(kube: Emulator, name: str, plural: str = "journalspecs") -> None:
    await call("DELETE", url(kube, name, plural))
    await eventually(lambda: obj(kube, name, plural) is None,
                     f"{name} is deleted and its finalizer released", 20)


def refused_by(kube: Emulator, name: str, owner: str) -> bool:
    synced = condition(kube, "Synced", name)
    return synced.get("reason") == "OwnedElsewhere" and status(kube, name).get("owner") == owner


async def test_two_resources_naming_one_journal_do_not_overwrite_each_other(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str, etcd: Etcd) -> None:
    """With two operator replicas acting at once (as while peering settles): the second
    resource is refused, naming the first; repairs restore the first's spec only;
    deleting the second leaves the journal; a third takes over once the first is gone."""
    key = f"{etcd_prefix}/items/example/journal"
    async with running_operators(running_operator(kube, etcd_server.endpoint, etcd_prefix),
                                 running_operator(kube, etcd_server.endpoint, etcd_prefix)):
        await create(kube, journal("first", 1))
        await eventually(lambda: status(kube, "first").get("ready") == "True", "synced", 20)
        await create(kube, journal("second", 2))
        await eventually(lambda: refused_by(kube, "second", "default/first"),
                         "the second is refused, naming the first", 20)
        assert condition(kube, "Ready", "second")["status"] == "True"  # valid, not written
        assert "declared by default/first" in condition(kube, "Synced", "second")["message"]
        assert status(kube, "second")["ready"] == "False"
        # Drift checks of both resources come and go; repairs restore the first's spec.
        for _ in range(3):
            await etcd.put(key, declared(JOURNAL_KIND, journal("x", 5)["spec"]).value)

            async def restored() -> bool:
                return await replication(etcd, key) == 1

            await eventually(restored, "the owner's spec is restored", 20)
        assert await replication(etcd, key) == 1
        assert not [e for e in events(kube, "Drift")
                    if e["involvedObject"]["name"] == "second"]
        await delete(kube, "second")
        assert await replication(etcd, key) == 1  # the first's journal stays

        await create(kube, journal("third", 3))
        await eventually(lambda: refused_by(kube, "third", "default/first"), "refused", 20)
        await delete(kube, "first")

        async def taken_over() -> bool:
            return await replication(etcd, key) == 3

        await eventually(taken_over, "the third takes over once the first is gone", 20)
        await eventually(lambda: status(kube, "third").get("ready") == "True", "synced", 20)
        assert status(kube, "third")["owner"] == "default/third"
        await delete(kube, "third")
        assert await replication(etcd, key) is None


async def test_a_renamed_journal_or_moved_shard_leaves_no_orphan(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str, etcd: Etcd) -> None:
    consumers = f"{etcd_prefix}-apps"
    async with running_operator(kube, etcd_server.endpoint, etcd_prefix, consumers):
        await create(kube, journal("renamed", 1, "old/name"))
        old, new = f"{etcd_prefix}/items/old/name", f"{etcd_prefix}/items/new/name"
        await eventually(lambda: status(kube, "renamed").get("etcdKey") == old, "synced", 20)
        await call("PATCH", url(kube, "renamed"), json={"spec": {"name": "new/name"}},
                   headers=MERGE)
        await eventually(lambda: status(kube, "renamed").get("etcdKey") == new, "moved", 20)
        assert await spec_in_etcd(etcd, old) is None
        assert await replication(etcd, new) == 1
        assert [e for e in events(kube, "Moved") if old in e["message"]]

        shard = {"apiVersion": "gazette-py.dev/v1alpha1", "kind": "ShardSpec",
                 "metadata": {"name": "moved", "namespace": "default"},
                 "spec": {"app": "one", "id": "part-0", "sources": [{"journal": "a/b"}]}}
        await create(kube, shard, "shardspecs")
        first = f"{consumers}/one/items/part-0"
        await eventually(lambda: status(kube, "moved", "shardspecs").get("etcdKey") == first,
                         "the shard is synced", 20)
        for change, key in (({"app": "two"}, f"{consumers}/two/items/part-0"),
                            ({"id": "part-1"}, f"{consumers}/two/items/part-1")):
            await call("PATCH", url(kube, "moved", "shardspecs"), json={"spec": change},
                       headers=MERGE)
            await eventually(lambda k=key: status(  # type: ignore[misc]
                kube, "moved", "shardspecs").get("etcdKey") == k, f"moved to {key}", 20)
        keys = [kv.key for kv in (await etcd.get_prefix(f"{consumers}/")).kvs]
        assert keys == [f"{consumers}/two/items/part-1"]
        await delete(kube, "moved", "shardspecs")
        assert (await etcd.get_prefix(f"{consumers}/")).kvs == []


async def test_a_delete_without_the_key_in_the_status_removes_the_spec(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str, etcd: Etcd) -> None:
    """The spec was committed to etcd but the status never said so (the operator killed
    in between), and the resource was deleted while the operator was down: the delete
    derives the key from the spec."""
    key = f"{etcd_prefix}/items/example/journal"
    async with running_operator(kube, etcd_server.endpoint, etcd_prefix):
        await create(kube, journal("lost", 1))
        await eventually(lambda: status(kube, "lost").get("ready") == "True", "synced", 20)
    # The operator is down: the status is lost, and the resource deleted meanwhile.
    await call("PATCH", url(kube, "lost") + "/status", json={"status": None}, headers=MERGE)
    assert "etcdKey" not in status(kube, "lost")
    await call("DELETE", url(kube, "lost"))
    assert obj(kube, "lost")["metadata"]["deletionTimestamp"]  # held by the finalizer
    assert await replication(etcd, key) == 1
    async with running_operator(kube, etcd_server.endpoint, etcd_prefix):
        await eventually(lambda: obj(kube, "lost") is None, "deleted", 20)
    assert await spec_in_etcd(etcd, key) is None


async def test_a_resource_that_becomes_invalid_says_so(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str, etcd: Etcd) -> None:
    key = f"{etcd_prefix}/items/example/journal"
    async with running_operator(kube, etcd_server.endpoint, etcd_prefix):
        await create(kube, journal("turns-bad", 1))
        await eventually(lambda: status(kube, "turns-bad").get("ready") == "True", "synced",
                         20)
        bad = {"spec": {"fragment": {"stores": ["s3://Not_A_Bucket/"]}}}  # passes the CRD
        await call("PATCH", url(kube, "turns-bad"), json=bad, headers=MERGE)

        def invalid() -> bool:
            return all(condition(kube, kind, "turns-bad").get("reason") == "InvalidSpec"
                       for kind in ("Ready", "Synced"))

        await eventually(invalid, "Ready=False and Synced=False, reason InvalidSpec", 20)
        for kind in ("Ready", "Synced"):
            found = condition(kube, kind, "turns-bad")
            assert found["status"] == "False", found
            assert "spec.fragment.stores[0]" in found["message"], found
        assert status(kube, "turns-bad")["ready"] == "False"
        assert await replication(etcd, key) == 1  # the last valid spec stays
        # The status wiped (restored from a backup, say): the drift check says it again.
        await call("PATCH", url(kube, "turns-bad") + "/status",
                   json={"status": {"ready": "True", "conditions": None}}, headers=MERGE)
        await eventually(invalid, "the drift check reports the invalid spec", 20)
        # Fixed: written again.
        await call("PATCH", url(kube, "turns-bad"),
                   json={"spec": {"replication": 2, "fragment": {"stores": ["file:///"]}}},
                   headers=MERGE)

        async def fixed() -> bool:
            return await replication(etcd, key) == 2

        await eventually(fixed, "written once fixed", 20)
        await eventually(lambda: status(kube, "turns-bad").get("ready") == "True",
                         "synced", 20)

