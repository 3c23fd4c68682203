"""Uninstalling: the chart's pre-delete hook (``python -m gazette_operator.uninstall``,
run here as a process against the emulated API, as the Job runs it) deletes the
release's resources while the operator still runs, so their specs leave etcd, and lets
go of the finalizer on whatever else carries it; with no operator left it lets go after
its timeout. In a namespace being deleted, the operator lets go of its finalizer when
etcd is gone with it, and when it is itself stopped. Real etcd; Kubernetes emulated."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import kmock
import pytest

from gazette.keyspace import Etcd
from gazette.local.etcd import EmbeddedEtcd
from tests.fixtures.kube import Emulator
from tests.fixtures.polling import eventually
from tests.fixtures.procs import run_process
from tests.integration.operator.test_operator import (
    call,
    create,
    obj,
    running_operator,
    spec_in_etcd,
    status,
    url,
)
from tests.integration.operator.test_operator_entrypoint import OperatorProcess, write_kubeconfig
from tests.integration.operator.test_operator_ownership import journal

pytestmark = pytest.mark.integration

FINALIZER = "rel.gazette-py.dev/finalizer"
DEPLOYMENTS = "apps/v1/deployments"
RELEASE = "app.kubernetes.io/instance=rel,app.kubernetes.io/component=spec"


def released(name: str, journal_name: str) -> dict[str, Any]:
    """A resource the release rendered (its labels), in namespace default."""
    resource = journal(name, 1, journal_name)
    resource["metadata"]["labels"] = {"app.kubernetes.io/instance": "rel",
                                      "app.kubernetes.io/component": "spec"}
    return resource


async def hook(kube: Emulator, tmp_path: Path, *args: str) -> tuple[int, str]:
    """The hook's program as a process with a kubeconfig naming the emulated API."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env.update(HOME=str(tmp_path), KUBECONFIG=str(write_kubeconfig(
        tmp_path / "hook-kubeconfig", str(kube.url).rstrip("/"))), FINALIZER=FINALIZER)
    code, _, err = await run_process(
        [sys.executable, "-m", "gazette_operator.uninstall", "--selector", RELEASE,
         "--namespaces", "default", *args], env, timeout=60)
    return code, err


def finalizers(kube: Emulator, name: str) -> list[str]:
    return list((obj(kube, name) or {}).get("metadata", {}).get("finalizers") or [])


SELECTOR = {"app.kubernetes.io/instance": "rel", "app.kubernetes.io/component": "operator"}


async def deployment_controller(kube: Emulator, op: OperatorProcess) -> None:
    """What Kubernetes does with the operator's Deployment scaled to zero: its pod gets
    SIGTERM, and its object goes once the process has exited."""
    base = str(kube.url).rstrip("/")

    def scaled_down() -> bool:
        found = kube.objects[DEPLOYMENTS, "default", "rel-gazette-operator"].raw
        return bool(found["spec"]["replicas"] == 0)

    await eventually(scaled_down, "the operator is scaled to zero", 60)
    assert await op.stop() == 0
    await call("DELETE", f"{base}/api/v1/namespaces/default/pods/rel-gazette-operator-0")


async def test_the_hook_deletes_the_release_resources_and_lets_go_of_the_rest(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str, etcd: Etcd,
        tmp_path: Path) -> None:
    """The operator runs as a process, as in its pod; the hook deletes the release's
    resources (the operator removes their specs), stops the operator, then lets go of
    the resource made outside the chart."""
    base = str(kube.url).rstrip("/")
    kube.resources[DEPLOYMENTS] = kmock.ResourceInfo(
        kind="Deployment", namespaced=True, verbs={"get", "list", "create", "patch"})
    kube.resources["v1/pods"] = kmock.ResourceInfo(
        kind="Pod", namespaced=True, verbs={"get", "list", "create", "delete"})
    await call("POST", f"{base}/apis/apps/v1/namespaces/default/deployments", json={
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "rel-gazette-operator", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": SELECTOR}}})
    await call("POST", f"{base}/api/v1/namespaces/default/pods", json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "rel-gazette-operator-0", "namespace": "default",
                     "labels": {**SELECTOR, "pod-template-hash": "abc"}}})
    await call("POST", f"{base}/api/v1/namespaces/default/pods", json={
        "apiVersion": "v1", "kind": "Pod",  # another component's: not waited for
        "metadata": {"name": "rel-gazette-broker-0", "namespace": "default",
                     "labels": {**SELECTOR, "app.kubernetes.io/component": "broker"}}})
    op = OperatorProcess(kube, etcd_server.endpoint, etcd_prefix, tmp_path, "operator-0",
                         PEERING_NAME="", FINALIZER=FINALIZER, WATCH_NAMESPACES="default")
    await op.start()
    controller = asyncio.create_task(deployment_controller(kube, op))
    try:
        await create(kube, released("one", "rel/one"))
        await create(kube, released("two", "rel/two"))
        await create(kube, journal("mine", 1, "user/journal"))  # made outside the chart
        for name in ("one", "two", "mine"):
            await op.until(lambda n=name: _ready(kube, n),  # type: ignore[misc]
                           f"{name} is synced", 20)
        assert finalizers(kube, "mine") == [FINALIZER]
        code, err = await hook(kube, tmp_path, "--timeout", "20",
                               "--deployment", "rel-gazette-operator",
                               "--deployment-namespace", "default")
        await controller
    finally:
        controller.cancel()
        if op.proc is not None and op.proc.returncode is None:
            await op.stop()
    assert code == 0, err
    assert obj(kube, "one") is None and obj(kube, "two") is None
    for name in ("rel/one", "rel/two"):  # removed by the operator before it went
        assert await spec_in_etcd(etcd, f"{etcd_prefix}/items/{name}") is None
    # Not the release's: kept, its spec too, but nothing holds it any more.
    assert obj(kube, "mine") is not None and finalizers(kube, "mine") == []
    assert await spec_in_etcd(etcd, f"{etcd_prefix}/items/user/journal") is not None
    assert "the operator (default/rel-gazette-operator) is stopped" in err
    assert "dropped the finalizer" in err and "default/mine" in err


async def _ready(kube: Emulator, name: str, ns: str = "default") -> bool:
    return status(kube, name, ns=ns).get("ready") == "True"


async def test_with_the_operator_gone_the_hook_lets_go_after_its_timeout(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str,
        tmp_path: Path) -> None:
    async with running_operator(kube, etcd_server.endpoint, etcd_prefix,
                                FINALIZER=FINALIZER):
        await create(kube, released("stuck", "rel/stuck"))
        await eventually(lambda: status(kube, "stuck").get("ready") == "True", "synced", 20)
    code, err = await hook(kube, tmp_path, "--timeout", "1")
    assert code == 0, err
    assert obj(kube, "stuck") is None  # deleted, and nothing holds it
    assert "did not release" in err and "stuck" in err


async def test_in_a_namespace_being_deleted_the_operator_lets_go(
        kube: Emulator, etcd_restartable: EmbeddedEtcd, etcd_prefix: str,
        tmp_path: Path) -> None:
    """`kubectl delete namespace`: etcd goes with it, then the operator (a process here,
    as in its pod). A resource deleted once etcd is gone is let go; the operator,
    stopping, lets go of the rest."""
    kube["get /api/v1/namespaces/doomed"] << {  # kmock cannot store Namespace objects
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "doomed", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Terminating"}}
    op = OperatorProcess(kube, etcd_restartable.endpoint, etcd_prefix, tmp_path, "op-0",
                         PEERING_NAME="", FINALIZER=FINALIZER)
    await op.start()
    try:
        for name in ("first", "second"):
            resource = journal(name, 1, f"doomed/{name}")
            resource["metadata"]["namespace"] = "doomed"
            await create(kube, resource)
            await op.until(lambda n=name: _ready(kube, n, "doomed"),  # type: ignore[misc]
                           f"{name} is synced", 20)
        await asyncio.to_thread(etcd_restartable.stop)
        await call("DELETE", url(kube, "first", ns="doomed"))
        await op.until(lambda: _gone(kube, "first", "doomed"),
                       "let go though etcd is gone", 30)
    finally:
        assert await op.stop() == 0, op.text()[-3000:]
    second = obj(kube, "second", ns="doomed")
    assert second is not None and not second["metadata"].get("finalizers"), op.text()[-3000:]
    assert "namespace being deleted: let go of doomed/second" in op.text()


async def _gone(kube: Emulator, name: str, ns: str) -> bool:
    return obj(kube, name, ns=ns) is None
