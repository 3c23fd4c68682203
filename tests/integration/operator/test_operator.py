"""The kopf operator against an emulated Kubernetes API (kmock) and a real etcd:
applying a JournalSpec puts its spec in etcd, an update changes it, deleting removes it
and releases the finalizer, a hand edit in etcd is repaired with an event, an invalid
resource gets Ready=False and nothing in etcd, and with a real broker the status shows
the primary."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import kopf
import pytest
import yaml

from gazette.client import JournalClient
from gazette.keyspace import Etcd
from gazette.keyspace.specs import decode_journal
from gazette.local.etcd import EmbeddedEtcd
from gazette_broker import BrokerServer
from gazette_operator import crds
from gazette_operator.operator import Config, build_registry
from tests.fixtures.kube import Emulator
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "operator" / "examples"
NS = "default"
DRIFT_INTERVAL = 0.5


def example(i: int = 0) -> dict[str, Any]:
    resource = copy.deepcopy(list(yaml.safe_load_all(
        (EXAMPLES / "journals.yaml").read_text()))[i])
    resource["metadata"]["namespace"] = NS
    return dict(resource)


@contextlib.asynccontextmanager
async def running_operator(kube: Emulator, etcd_endpoint: str, prefix: str,
                           consumer_prefix: str = "/gazette/consumers", *,
                           drift_interval: float = DRIFT_INTERVAL, **env: str
                           ) -> AsyncIterator[SimpleNamespace]:
    """The operator against `kube` and the etcd at `etcd_endpoint` (broker specs under
    `prefix`, consumer applications' under `consumer_prefix`; more of its environment in
    `env`, e.g. WATCH_NAMESPACES, FINALIZER), in a thread with its own event loop: kopf,
    stopping, takes every task of its loop started after it for its own and waits 5 s
    for it, which a test's tasks (a fixture's teardown, another operator) would be."""
    registry = build_registry(drift_interval)
    connection = kopf.ConnectionInfo(server=str(kube.url).rstrip("/"), insecure=True)

    @kopf.on.login(registry=registry)
    def _login(**_: Any) -> kopf.ConnectionInfo:
        return connection

    config = Config({"ETCD_ADDRESS": etcd_endpoint, "BROKER_ETCD_PREFIX": prefix,
                     "CONSUMER_ETCD_PREFIX": consumer_prefix,
                     "DRIFT_INTERVAL": str(drift_interval), **env})
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 10
    namespaces = [n for n in env.get("WATCH_NAMESPACES", "").split(",") if n]
    # kmock cannot list namespaces (/api/v1/namespaces): take them as given, as kopf
    # does when it may not list them (the chart grants no such right).
    settings.scanning.disabled = bool(namespaces)
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(kopf.operator(
                registry=registry, settings=settings, standalone=True,
                clusterwide=not namespaces, namespaces=namespaces,
                memo=kopf.Memo(config=config, connection=connection), stop_flag=stop,
                ready_flag=ready))
        except BaseException as err:  # noqa: BLE001 - reported by the test
            failure.append(err)
            ready.set()

    thread = threading.Thread(target=run, name=f"operator-{prefix}", daemon=True)
    thread.start()
    assert await asyncio.to_thread(ready.wait, 30), "the operator did not start in 30 s"
    assert not failure, failure
    try:
        yield SimpleNamespace(kube=kube, prefix=prefix, key=f"{prefix}/items/example/journal",
                              operator_root=config.operator_root, stop=stop)
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive(), "the operator did not stop in 30 s"
        assert not failure, failure


@contextlib.asynccontextmanager
async def running_operators(*operators: contextlib.AbstractAsyncContextManager[SimpleNamespace]
                            ) -> AsyncIterator[list[SimpleNamespace]]:
    """Several `running_operator`s at once (two replicas acting together, or two
    releases)."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(o) for o in operators]


@pytest.fixture
async def operator(kube: Emulator, etcd_server: EmbeddedEtcd,
                   etcd_prefix: str) -> AsyncIterator[SimpleNamespace]:
    async with running_operator(kube, etcd_server.endpoint, etcd_prefix) as running:
        yield running


def url(kube: Emulator, name: str = "", plural: str = "journalspecs", ns: str = NS) -> str:
    base = f"{str(kube.url).rstrip('/')}/apis/{crds.GROUP}/{crds.VERSION}/namespaces/{ns}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


async def call(method: str, target: str, **kwargs: Any) -> Any:
    async with aiohttp.ClientSession() as http, http.request(method, target, **kwargs) as r:
        assert r.status < 300, await r.text()
        return await r.json()


async def create(kube: Emulator, resource: dict[str, Any], plural: str = "journalspecs"
                 ) -> None:
    ns = resource["metadata"].get("namespace") or NS
    await call("POST", url(kube, plural=plural, ns=ns), json=resource)


def obj(kube: Emulator, name: str, plural: str = "journalspecs", ns: str = NS) -> Any:
    """The resource as the API holds it now (None: absent or deleted)."""
    try:
        found = kube.objects[f"{crds.GROUP}/{crds.VERSION}/{plural}", ns, name]
    except KeyError:
        return None
    return None if found.deleted else found.raw


async def test_a_journal_resource_becomes_a_spec_in_etcd(operator: SimpleNamespace,
                                                          etcd: Etcd) -> None:
    kube = operator.kube
    await create(kube, example())
    key = f"{operator.prefix}/items/example/journal"

    async def in_etcd() -> bool:
        return (await etcd.get(key))[1] is not None

    await eventually(in_etcd, "the spec is in etcd", 20)
    await eventually(lambda: (obj(kube, "example-journal") or {}).get("status", {})
                     .get("ready") == "True", "the status says Ready", 20)
    status = obj(kube, "example-journal")["status"]
    assert status["etcdKey"] == key and status["modRevision"] > 0
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True", "Synced": "True"}
    _, kv = await etcd.get(key)
    assert kv is not None and decode_journal(kv.value).replication == 1


def status(kube: Emulator, name: str = "example-journal", plural: str = "journalspecs",
           ns: str = NS) -> dict[str, Any]:
    return dict((obj(kube, name, plural, ns) or {}).get("status", {}))


def condition(kube: Emulator, kind: str, name: str = "example-journal",
              plural: str = "journalspecs", ns: str = NS) -> dict[str, Any]:
    """The condition `kind` (Ready, Synced) of the resource's status ({} if none)."""
    return next((dict(c) for c in status(kube, name, plural, ns).get("conditions", [])
                 if c["type"] == kind), {})


def events(kube: Emulator, reason: str) -> list[Any]:
    """The Kubernetes events of `reason` the operator posted."""
    return [o.raw for (resource, _, _), o in kube.objects.items()
            if resource.plural == "events" and not o.deleted
            and o.raw.get("reason") == reason]


async def spec_in_etcd(etcd: Etcd, key: str) -> Any:
    _, kv = await etcd.get(key)
    return decode_journal(kv.value) if kv is not None else None


async def test_updates_and_deletes_follow_the_resource(operator: SimpleNamespace,
                                                       etcd: Etcd) -> None:
    kube, key = operator.kube, operator.key
    await create(kube, example())
    await eventually(lambda: status(kube).get("ready") == "True", "synced", 20)
    await call("PATCH", url(kube, "example-journal"), json={"spec": {"replication": 2}},
               headers={"Content-Type": "application/merge-patch+json"})

    async def replicated_twice() -> bool:
        spec = await spec_in_etcd(etcd, key)
        return spec is not None and spec.replication == 2

    await eventually(replicated_twice, "the update reached etcd", 20)
    assert obj(kube, "example-journal")["metadata"]["finalizers"]  # kopf's, for deletes
    await call("DELETE", url(kube, "example-journal"))

    async def gone() -> bool:
        return await spec_in_etcd(etcd, key) is None and obj(kube, "example-journal") is None

    await eventually(gone, "the key is removed and the finalizer released", 20)


async def test_a_hand_edit_in_etcd_is_repaired_with_an_event(operator: SimpleNamespace,
                                                             etcd: Etcd) -> None:
    kube, key = operator.kube, operator.key
    await create(kube, example())
    await eventually(lambda: status(kube).get("ready") == "True", "synced", 20)
    declared = (await etcd.get(key))[1]
    assert declared is not None
    await etcd.put(key, b"\x08\x01")  # someone writes over it by hand

    async def repaired() -> bool:
        _, kv = await etcd.get(key)
        return kv is not None and kv.value == declared.value

    await eventually(repaired, "the declared spec is restored", 20)
    await etcd.delete_prefix(key)  # and deletes it
    await eventually(repaired, "restored again", 20)

    await eventually(lambda: len(events(kube, "Drift")) >= 2, "Drift events are recorded", 20)
    assert "restored" in events(kube, "Drift")[0]["message"]


async def test_an_invalid_resource_is_not_ready_and_writes_nothing(
    operator: SimpleNamespace, etcd: Etcd,
) -> None:
    kube = operator.kube
    bad = example()
    bad["spec"]["fragment"]["stores"] = ["s3://Not_A_Bucket/"]  # passes the CRD schema
    await create(kube, bad)
    await eventually(lambda: any(c.get("reason") == "InvalidSpec"
                                 for c in status(kube).get("conditions", [])),
                     "Ready=False with the reason", 20)
    [ready] = [c for c in status(kube)["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "False" and "spec.fragment.stores[0]" in ready["message"]
    assert status(kube)["ready"] == "False"
    assert await spec_in_etcd(etcd, operator.key) is None
    # Fixed: it syncs.
    await call("PATCH", url(kube, "example-journal"),
               json={"spec": {"fragment": {"stores": ["file:///"]}}},
               headers={"Content-Type": "application/merge-patch+json"})
    await eventually(lambda: status(kube).get("ready") == "True", "synced once fixed", 20)
    assert await spec_in_etcd(etcd, operator.key) is not None


async def test_the_status_shows_the_primary_a_broker_serves(
    operator: SimpleNamespace, broker_server: BrokerServer,
) -> None:
    kube = operator.kube
    assert broker_server.layout.root == operator.prefix
    journal = example()
    journal["spec"]["fragment"]["stores"] = ["file:///"]  # the broker's file root
    await create(kube, journal)
    me = f"{broker_server.id.zone}/{broker_server.id.suffix}"
    await eventually(lambda: status(kube).get("primary") == me, "the primary is shown", 20)
    assert status(kube)["replicas"] == [me]
    # The journal is really served: an append through the broker lands.
    async with JournalClient(broker_server.grpc_address) as client:
        await client.append("example/journal", b'{"via": "operator"}\n')


async def test_etcd_down_is_not_synced_and_it_syncs_when_back(
    kube: Emulator, etcd_restartable: EmbeddedEtcd, etcd_prefix: str,
) -> None:
    async with running_operator(kube, etcd_restartable.endpoint, etcd_prefix) as running:
        await asyncio.to_thread(etcd_restartable.stop)
        await create(kube, example())

        def synced() -> str:
            return next((f"{c['status']} {c.get('reason')}" for c in
                         status(kube).get("conditions", []) if c["type"] == "Synced"), "")

        await eventually(lambda: synced() == "False EtcdUnavailable",
                         "Synced=False while etcd is down", 30)
        assert status(kube)["ready"] == "False"
        await asyncio.to_thread(etcd_restartable.start)
        await eventually(lambda: status(kube).get("ready") == "True",
                         "synced by itself once etcd is back", 40)
        async with Etcd(etcd_restartable.endpoint) as etcd:
            assert await spec_in_etcd(etcd, running.key) is not None
