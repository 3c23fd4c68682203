"""Two releases of the chart side by side: each operator watches its own namespace, puts
its own finalizer, and writes into its own etcd; neither touches the other's resources.
Two real etcds; Kubernetes emulated (kmock)."""

from __future__ import annotations

import pytest

from gazette.keyspace import Etcd
from gazette.local.etcd import EmbeddedEtcd
from tests.fixtures.kube import Emulator
from tests.fixtures.polling import eventually
from tests.integration.operator.test_operator import (
    call,
    create,
    obj,
    running_operator,
    running_operators,
    spec_in_etcd,
    status,
    url,
)
from tests.integration.operator.test_operator_ownership import journal

pytestmark = pytest.mark.integration


async def test_two_operators_each_serve_their_own_namespace(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_restartable: EmbeddedEtcd,
        etcd_prefix: str, etcd: Etcd) -> None:
    key = f"{etcd_prefix}/items/example/journal"
    releases = {"team-a": (etcd_server, 1), "team-b": (etcd_restartable, 2)}
    async with Etcd(etcd_restartable.endpoint) as other:
        clients = {"team-a": etcd, "team-b": other}
        async with running_operators(*(
                running_operator(kube, server.endpoint, etcd_prefix, WATCH_NAMESPACES=ns,
                                 FINALIZER=f"{ns}.gazette-py.dev/finalizer")
                for ns, (server, _) in releases.items())):
            for ns, (_, replication) in releases.items():
                resource = journal("example-journal", replication)
                resource["metadata"]["namespace"] = ns
                await create(kube, resource)
            for ns, (_, replication) in releases.items():
                await eventually(lambda n=ns: status(  # type: ignore[misc]
                    kube, ns=n).get("ready") == "True", f"{ns} is synced", 20)
                spec = await spec_in_etcd(clients[ns], key)
                assert spec is not None and spec.replication == replication, ns
                # Only its own operator's finalizer.
                assert obj(kube, "example-journal", ns=ns)["metadata"]["finalizers"] == [
                    f"{ns}.gazette-py.dev/finalizer"]
            for ns in releases:
                await call("DELETE", url(kube, "example-journal", ns=ns))
            for ns in releases:
                await eventually(lambda n=ns: obj(  # type: ignore[misc]
                    kube, "example-journal", ns=n) is None, f"{ns} is deleted", 20)
                assert await spec_in_etcd(clients[ns], key) is None


async def test_the_default_finalizer_of_an_older_install_is_dropped(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str, etcd: Etcd) -> None:
    """Upgraded to a finalizer of its own, the operator drops the default one older
    versions put on resources (nothing else would remove it: deletes would hang)."""
    mine = "rel.default.gazette-py.dev/finalizer"
    old = journal("example-journal", 1)
    old["metadata"]["finalizers"] = ["gazette-py.dev/finalizer"]
    await create(kube, old)
    async with running_operator(kube, etcd_server.endpoint, etcd_prefix, FINALIZER=mine):
        await eventually(lambda: obj(kube, "example-journal")["metadata"].get(
            "finalizers") == [mine], "only its own finalizer is left", 20)
        await call("DELETE", url(kube, "example-journal"))
        await eventually(lambda: obj(kube, "example-journal") is None, "deleted", 20)
    assert await spec_in_etcd(etcd, f"{etcd_prefix}/items/example/journal") is None
