"""The operator and a real consumer application: a `ShardSpec` resource becomes a shard
that a consumer member runs, and the resource's status shows the member that is its
primary and the shard's state, written by the member into etcd; a shard whose app fails
shows ``failed`` with the error. Kubernetes is emulated (kmock); etcd, the broker and the
member are real."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from gazette.consumer.member import ConsumerMember
from gazette.local.etcd import EmbeddedEtcd
from tests.fixtures.kube import Emulator
from tests.fixtures.polling import eventually
from tests.integration.operator.test_operator import NS, call, running_operator, status, url

pytestmark = pytest.mark.integration

PLURAL = "shardspecs"


@pytest.fixture
async def operator(kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str,
                   consumer_root: str) -> AsyncIterator[SimpleNamespace]:
    async with running_operator(kube, etcd_server.endpoint, etcd_prefix,
                                consumer_root) as running:
        yield running


def shard(name: str, shard_id: str, journal: str) -> dict[str, Any]:
    return {"apiVersion": "gazette-py.dev/v1alpha1", "kind": "ShardSpec",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"app": "counter", "id": shard_id, "sources": [{"journal": journal}]}}


async def test_the_status_shows_a_shards_primary_and_state(
    operator: SimpleNamespace, member: ConsumerMember,
) -> None:
    kube = operator.kube
    me = f"{member.id.zone}/{member.id.suffix}"
    await call("POST", url(kube, plural=PLURAL), json=shard("counts-0", "op/counts-0",
                                                              "counts/in-0"))
    await eventually(lambda: status(kube, "counts-0", PLURAL).get("state") == "primary",
                     "the shard's state is shown", 30)
    shown = status(kube, "counts-0", PLURAL)
    assert shown["primary"] == me and shown["replicas"] == [me]

    # An app that fails (its source journal does not exist) shows failed, with why.
    await call("POST", url(kube, plural=PLURAL), json=shard("broken", "op/broken",
                                                              "no/such-journal"))
    await eventually(lambda: status(kube, "broken", PLURAL).get("state", "")
                     .startswith("failed: "), "the failure is shown", 30)
    assert "no/such-journal" in status(kube, "broken", PLURAL)["state"]
    # The member keeps serving its other shard.
    assert status(kube, "counts-0", PLURAL)["state"] == "primary"
