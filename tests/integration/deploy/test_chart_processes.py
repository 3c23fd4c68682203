"""The chart, run as processes: ``helm template`` renders the release, and every pod's
containers run as the kubelet would run them (tests/fixtures/release.py says exactly how
this differs from a cluster), the gazette containers from the built images' own roots.

Two value sets: the chart's defaults with MinIO and the consumer on (README's ``helm
install`` plus the word-count consumer and a Spark job, whose counts agree word for
word), and a production-like file
(ci/production-values.yaml: images from a registry, three etcd members with volumes,
three brokers, two operators, an S3 bucket of our own, an application image built FROM
the consumer image, a CronJob export). For each: etcd, MinIO's stand-in, the brokers,
the operator(s) against the emulated API (logged in with their service account) and the
consumer start; every startup, readiness and liveness probe answers; the operator's
examples are applied as ``kubectl apply`` sends them; the journals take appends through
the broker Service's port; the word-count shards run and answer their query route; a
Spark job of ``sparkJobs`` runs with the rendered environment; ``helm uninstall``'s
pre-delete hook leaves nothing holding a finalizer; everything stops cleanly on
SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
import trustme
import yaml
from aiohttp.test_utils import RawTestServer

from gazette.client import JournalClient
from tests.fixtures.doc_commands import commands
from tests.fixtures.helm import Helm
from tests.fixtures.images import (
    TARGETS,
    Image,
    build,
    build_app_image,
    build_images,
)
from tests.fixtures.kube import Emulator, serve_our_resources
from tests.fixtures.polling import eventually
from tests.fixtures.procs import Process, free_port
from tests.fixtures.release import Release
from tests.fixtures.s3 import find_moto_server

# The first test waits for the images: on a fresh machine a cold build (a Debian base,
# every dependency, a JRE) started in the background at the session's start.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "gazette"
EXAMPLES = ROOT / "operator" / "examples"
APP = Path(__file__).parent / "app"
RELEASE = NAMESPACE = "gazette"
REGISTRY = "registry.example.com/gazette"


class QuickStart:
    """docs/kubernetes.md's quick start, the commands this test runs as they are written:
    its `helm install` (values), `curl` append, in-pod `publish` and query."""

    def __init__(self) -> None:
        steps = commands("docs/kubernetes.md")
        [install, *_] = [c for c in steps if c.line.startswith("helm install ")]
        argv = install.argv()[4:]
        self.helm_args = [a for i, a in enumerate(argv) if a != "--create-namespace"
                          and "--namespace" not in (a, argv[i - 1] if i else "")]
        [put, *_] = [c for c in steps if c.line.startswith("curl -X PUT")]
        words = put.argv()
        self.append_path = urllib.parse.urlsplit(words[-1]).path
        self.append_body = words[words.index("--data-binary") + 1].encode()
        [publish] = [c for c in steps if " publish " in c.line]
        self.publish = publish.argv()[publish.argv().index("--") + 1:]
        [query] = [c for c in steps if "/word-count/" in c.line]
        self.word = query.argv()[-1].rsplit("/", 1)[1]
        self.count = self.publish[-1].split().count(self.word)
        assert self.count > 0, (self.publish, self.word)


QUICK_START = QuickStart()


# --- the emulated API server, behind TLS as a cluster's is --------------------------------

@contextlib.asynccontextmanager
async def api_server(workdir: Path) -> AsyncIterator[tuple[Emulator, str, Path,
                                                            ssl.SSLContext]]:
    """kmock's emulator on https://127.0.0.1:<port> with a CA of its own: (emulator, URL,
    the CA file pods trust, a client context trusting it)."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "kubernetes.default.svc").configure_cert(server_context)

    class TLSServer(RawTestServer):
        async def start_server(self, loop: Any = None, **kwargs: Any) -> None:
            await super().start_server(loop=loop, ssl=server_context, **kwargs)

    ca_file = workdir / "api-ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    async with Emulator() as emulator, kmock.Server(emulator, server_cls=TLSServer) as srv:
        serve_our_resources(emulator)
        verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
        emulator.resources["kopf.dev/v1/clusterkopfpeerings"] = kmock.ResourceInfo(
            kind="ClusterKopfPeering", namespaced=False, verbs=verbs)
        emulator.resources["kopf.dev/v1/kopfpeerings"] = kmock.ResourceInfo(
            kind="KopfPeering", namespaced=True, verbs=verbs)
        emulator.resources["v1/nodes"] = kmock.ResourceInfo(
            kind="Node", namespaced=False, verbs={"get", "list", "create"})
        # What `helm uninstall`'s pre-delete hook reads and scales.
        emulator.resources["apps/v1/deployments"] = kmock.ResourceInfo(
            kind="Deployment", namespaced=True, verbs=verbs)
        emulator.resources["v1/pods"] = kmock.ResourceInfo(
            kind="Pod", namespaced=True, verbs=verbs)
        yield emulator, f"https://127.0.0.1:{srv.port}", ca_file, client


class Kubectl:
    """What ``kubectl apply`` and ``get`` send, against the emulated API."""

    PLURALS = {"JournalSpec": "journalspecs", "ShardSpec": "shardspecs",
               "ClusterKopfPeering": "clusterkopfpeerings", "KopfPeering": "kopfpeerings",
               "Node": "nodes", "Deployment": "deployments", "Pod": "pods"}

    def __init__(self, url: str, context: ssl.SSLContext) -> None:
        self.url, self.context = url, context

    def path(self, obj: dict[str, Any]) -> str:
        group_version = obj["apiVersion"]
        base = f"/api/{group_version}" if "/" not in group_version else \
            f"/apis/{group_version}"
        namespace = obj["metadata"].get("namespace")
        scope = f"/namespaces/{namespace}" if namespace else ""
        return f"{self.url}{base}{scope}/{self.PLURALS[obj['kind']]}"

    async def apply(self, *objects: dict[str, Any]) -> None:
        async with aiohttp.ClientSession() as http:
            for obj in objects:
                async with http.post(self.path(obj), json=obj, ssl=self.context) as r:
                    assert r.status < 300, f"{obj['kind']} {obj['metadata']}: {await r.text()}"

    async def items(self, kind: str, api_version: str) -> list[dict[str, Any]]:
        probe = {"apiVersion": api_version, "kind": kind,
                 "metadata": {"namespace": NAMESPACE}}
        async with aiohttp.ClientSession() as http, http.get(
                self.path(probe), ssl=self.context) as r:
            assert r.status == 200, await r.text()
            return list((await r.json()).get("items") or [])

    async def delete(self, obj: dict[str, Any]) -> None:
        async with aiohttp.ClientSession() as http, http.delete(
                f"{self.path(obj)}/{obj['metadata']['name']}", ssl=self.context) as r:
            assert r.status < 300, await r.text()

    async def get(self, obj: dict[str, Any]) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(
                f"{self.path(obj)}/{obj['metadata']['name']}", ssl=self.context) as r:
            assert r.status == 200, await r.text()
            answer: dict[str, Any] = await r.json()
            return answer


def namespaced(obj: dict[str, Any], namespace: str = NAMESPACE) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}


def examples() -> list[dict[str, Any]]:
    """operator/examples, as ``kubectl apply -f operator/examples/ -n gazette`` sends them."""
    return [namespaced(d) for f in sorted(EXAMPLES.glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]


# --- the release ---------------------------------------------------------------------------

def render(helm: Helm, *args: str | Path) -> list[dict[str, Any]]:
    out = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def images_of(objects: list[dict[str, Any]]) -> set[str]:
    refs = set()
    for o in objects:
        spec = o.get("spec", {})
        spec = spec.get("jobTemplate", {}).get("spec", spec)
        pod = spec.get("template", {}).get("spec", {})
        for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            refs.add(c["image"])
    return refs


def s3_secret(name: str) -> dict[str, Any]:
    """The Secret a user creates for broker.s3.existingSecret."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "stringData": {"AWS_ACCESS_KEY_ID": "gazette", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}}


def pods_of(release: Release, component: str) -> list[str]:
    return [name for name, pod in release.pods.items()
            if pod.labels.get("app.kubernetes.io/component", "").startswith(component)]


async def start(release: Release, names: list[str]) -> None:
    for name in names:
        await asyncio.to_thread(release.start, name)
    await asyncio.gather(*(asyncio.to_thread(release.wait_ready, n, 120) for n in names))


def http(method: str, url: str, data: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


async def run_release(release: Release, kubectl: Kubectl, rendered: list[dict[str, Any]]
                      ) -> None:
    """Everything a `helm install` starts, then what the quick start does with it."""
    qs = QUICK_START
    # What Helm creates besides the workloads, that the emulated API keeps.
    await kubectl.apply(*(namespaced(o) if o["kind"] != "ClusterKopfPeering" else o
                          for o in rendered if o["kind"] in Kubectl.PLURALS))
    await start(release, pods_of(release, "etcd"))
    if minio := pods_of(release, "minio"):
        await start(release, minio)
        [hook] = [o["metadata"]["name"] for o in rendered if o["kind"] == "Job"
                  and "post-install" in o["metadata"].get("annotations", {}).get(
                      "helm.sh/hook", "")]
        _, code, output = await asyncio.to_thread(release.run_job, hook)
        assert code == 0, output
    await start(release, [*pods_of(release, "broker"), *pods_of(release, "operator"),
                          *pods_of(release, "consumer")])

    # kubectl apply -f operator/examples/: the operator writes them into etcd.
    await kubectl.apply(*examples())
    broker = release.address(f"{RELEASE}-broker", 8081)

    last: list[tuple[int, bytes]] = []

    async def takes_appends() -> bool:
        last[:] = [await asyncio.to_thread(http, "PUT", f"http://{broker}{qs.append_path}",
                                           qs.append_body)]
        return 200 <= last[0][0] < 300

    try:
        await eventually(takes_appends, "example/journal takes appends through the Service",
                         timeout=90, interval=0.5)
    except AssertionError as err:
        raise AssertionError(f"{err}; the last answer: {last}") from None
    for journal in ("foobar/part-000", "events/clicks"):
        code, body = await asyncio.to_thread(http, "PUT", f"http://{broker}/{journal}",
                                             b'{"n": 1}\n')
        assert 200 <= code < 300, (journal, body)
    code, body = await asyncio.to_thread(http, "GET", f"http://{broker}{qs.append_path}")
    assert code == 200 and qs.append_body in body, body
    status = await kubectl.get(namespaced(examples()[0]))
    assert status["status"]["etcdKey"].endswith("/items/example/journal"), status

    # The word-count shards run: lines published as `kubectl exec` into a consumer pod
    # would, and a word's count asked on the query route of a consumer pod.
    [consumer_pod, *_] = pods_of(release, "consumer")
    pod = release.pods[consumer_pod]
    [container] = pod.containers()
    code, output = await asyncio.to_thread(
        release.run_container, pod, {**container, "command": qs.publish, "args": []})
    assert code == 0, output

    async def counted() -> bool:
        code, body = await asyncio.to_thread(
            http, "GET", f"http://127.0.0.1:{pod.port('http')}/word-count/{qs.word}")
        return code == 200 and json.loads(body)["count"] == qs.count

    await eventually(counted, f"the word-count shards counted {qs.word!r} {qs.count} "
                     "time(s)", timeout=90, interval=0.5)
    # Every probe of every pod still answers.
    for name in release.pods:
        if release.pods[name].processes:
            await asyncio.to_thread(release.wait_ready, name, 30)


async def persisted(release: Release, journal: str) -> None:
    """Until a fragment of `journal` is in its store (what Spark jobs read)."""
    async with JournalClient(release.address(f"{RELEASE}-broker", 8080)) as client:
        async def stored() -> bool:
            return any(f.fragment.backing_store for f in await client.list_fragments(journal))

        await eventually(stored, f"a fragment of {journal} is persisted", timeout=60,
                         interval=0.5)


async def helm_uninstall(release: Release, kubectl: Kubectl, rendered: list[dict[str, Any]]
                         ) -> None:
    """`helm uninstall`'s pre-delete hook, as Helm runs it while everything still runs:
    the rendered Job from the operator's image against the API. This test plays the
    Deployment controller and the kubelet: when the hook scales the operator to zero, its
    processes get SIGTERM and its Pod objects go."""
    operators = pods_of(release, "operator")
    [deployment] = [o for o in rendered if o["kind"] == "Deployment"
                    and o["metadata"]["name"] == release.pods[operators[0]].workload[
                        "metadata"]["name"]]
    # The Deployment was created with the release; its pods are the running processes.
    await kubectl.apply(*(namespaced({
        "apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "labels": release.pods[name].labels}}) for name in operators))
    [hook] = [o["metadata"]["name"] for o in rendered if o["kind"] == "Job"
              and "pre-delete" in o["metadata"].get("annotations", {}).get("helm.sh/hook", "")]

    async def scaled_down() -> bool:
        return (await kubectl.get(namespaced(deployment)))["spec"]["replicas"] == 0

    async def controller() -> None:
        await eventually(scaled_down, "the hook scaled the operator to zero", timeout=300,
                         interval=0.2)
        for name in operators:
            for proc in release.pods[name].processes.values():
                await asyncio.to_thread(proc.stop, 60)
            await kubectl.delete(namespaced({"apiVersion": "v1", "kind": "Pod",
                                             "metadata": {"name": name}}))

    scaling = asyncio.ensure_future(controller())
    try:
        _, code, output = await asyncio.to_thread(release.run_job, hook, 300)
        assert code == 0, output
        assert scaling.done(), f"the hook never scaled the operator down:\n{output}"
    finally:
        scaling.cancel()
    # Nothing is left holding a finalizer no operator will remove: the resources
    # applied by hand stay (their specs in etcd too), released.
    left = [*await kubectl.items("JournalSpec", "gazette-py.dev/v1alpha1"),
            *await kubectl.items("ShardSpec", "gazette-py.dev/v1alpha1")]
    assert {o["metadata"]["name"] for o in left} == {
        o["metadata"]["name"] for o in examples()}
    assert not [o["metadata"]["name"] for o in left if o["metadata"].get("finalizers")], \
        output


def stops_cleanly(release: Release) -> None:
    """SIGTERM ends every gazette process with status 0 (drains, then exits)."""
    for name in [*pods_of(release, "consumer"), *pods_of(release, "operator"),
                 *pods_of(release, "broker")]:
        for proc in release.pods[name].processes.values():
            proc.stop(timeout=60)
            assert proc.popen is not None and proc.popen.returncode == 0, (
                f"{proc.name} exited {proc.popen and proc.popen.returncode} on SIGTERM")


@pytest.fixture(scope="module")
def images() -> dict[str, Image]:
    return build()


def image_map(built: dict[str, Image], registry: str = "") -> dict[str, Image]:
    """The references the chart renders → the images built with those tags."""
    return {build_images.image_name(t, registry): built[t] for t in TARGETS}


def test_the_chart_pulls_what_make_images_builds(helm: Helm, images: dict[str, Image]
                                                 ) -> None:
    rendered = render(helm, "--set", "minio.enabled=true", "--set", "consumer.enabled=true",
                      "--set-json", 'sparkJobs.jobs=[{"name":"wc","job":"word_count",'
                      '"args":["--output","/tmp/wc"]}]')
    ours = {r for r in images_of(rendered) if r.split("/")[-1].startswith("gazette-")}
    assert ours == set(image_map(images)), ours
    # The tag is the chart's appVersion, which is the distribution's version.
    assert build_images.app_version() == __import__("importlib.metadata").metadata.version(
        "gazette-py")


async def test_default_values(helm: Helm, images: dict[str, Image], tmp_path: Path) -> None:
    """The quick start's `helm install` (the chart's defaults, its registry, MinIO and the
    consumer) and a Spark job."""
    pushed = build(registry=REGISTRY)
    assert f"image.registry={REGISTRY}" in QUICK_START.helm_args
    rendered = render(
        helm, *QUICK_START.helm_args,
        "--set-json", 'sparkJobs.jobs=[{"name":"word-count","job":"word_count","args":'
        '["--journals","name=examples/word-count/lines","--output","/tmp/word-count",'
        '"--field","text"]}]')
    async with api_server(tmp_path) as (_kube, url, ca, context):
        kubectl = Kubectl(url, context)
        await kubectl.apply({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": "node-0", "labels": {"topology.kubernetes.io/zone": "zone-a"}}})
        release = Release(rendered, NAMESPACE, image_map(pushed, REGISTRY), tmp_path, url,
                          ca)
        try:
            await run_release(release, kubectl, rendered)
            # The Spark job: word_count over the persisted lines (flushed every 5 s).
            await persisted(release, "examples/word-count/lines")
            pod, code, output = await asyncio.to_thread(
                release.run_job, f"{RELEASE}-spark-word-count")
            assert code == 0, output
            [csv] = list((release.workdir / "pods" / pod.name / "tmp" / "word-count")
                         .glob("*.csv"))
            counted = f"{QUICK_START.word},{QUICK_START.count}"
            assert counted in csv.read_text().replace('"', ""), csv.read_text()
            # The two word counts agree: every word the Spark job counted, the consumer's
            # shards count alike (asked on a consumer pod's query route).
            spark_counts = {row[0]: int(row[1]) for row in
                            (line.replace('"', "").split(",") for line in
                             csv.read_text().splitlines()[1:]) if row[0]}
            [consumer_pod, *_] = pods_of(release, "consumer")
            port = release.pods[consumer_pod].port("http")
            consumer_counts = {}
            for word in spark_counts:
                code, body = await asyncio.to_thread(
                    http, "GET", f"http://127.0.0.1:{port}/word-count/{word}")
                assert code == 200, (word, body)
                consumer_counts[word] = json.loads(body)["count"]
            assert len(spark_counts) > 1 and consumer_counts == spark_counts
            await helm_uninstall(release, kubectl, rendered)
            await asyncio.to_thread(stops_cleanly, release)
        finally:
            await asyncio.to_thread(release.stop_all)


async def test_production_values(helm: Helm, images: dict[str, Image], tmp_path: Path
                                 ) -> None:
    # Images as pushed to a registry of our own (`make images REGISTRY=...`: the layers
    # are cached, only the tags are new), and our application's image FROM the consumer.
    pushed = build(registry=REGISTRY)
    app = build_app_image(pushed["consumer"], APP, f"{REGISTRY}/word-count-app:1.0")
    # An S3 server of our own, its bucket and the Secret of its credentials.
    port = free_port()
    s3 = Process("s3", [find_moto_server(), "-H", "127.0.0.1", "-p", str(port)],
                 tmp_path / "s3.log")
    s3.start()
    try:
        s3.wait_until(lambda: bool(http("GET", f"http://127.0.0.1:{port}/")[0]), 30,
                      "serving S3")
        assert http("PUT", f"http://127.0.0.1:{port}/gazette")[0] == 200
        rendered = render(helm, "--values", CHART / "ci" / "production-values.yaml",
                          "--set", f"broker.s3.endpoint=http://127.0.0.1:{port}")
        by_ref = {**image_map(pushed, REGISTRY), f"{REGISTRY}/word-count-app:1.0": app}
        assert images_of(rendered) - {"quay.io/coreos/etcd:v3.5.21"} <= set(by_ref), \
            images_of(rendered)
        async with api_server(tmp_path) as (_, url, ca, context):
            kubectl = Kubectl(url, context)
            await kubectl.apply({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": "node-0", "labels": {"topology.kubernetes.io/zone": "zone-b"}}})
            release = Release(rendered, NAMESPACE, by_ref, tmp_path, url, ca,
                              extra_objects=[s3_secret("gazette-s3")])
            assert len(pods_of(release, "etcd")) == 3 and len(pods_of(release, "operator")) == 2
            try:
                await run_release(release, kubectl, rendered)
                # An etcd member back from a crash with its volume rejoins (persistence).
                etcd = release.pods[f"{RELEASE}-etcd-1"].processes["etcd"]
                etcd.kill()
                etcd.start()
                await asyncio.to_thread(release.wait_ready, f"{RELEASE}-etcd-1", 60)
                # The CronJob, run now as `kubectl create job --from=cronjob/...` would.
                await persisted(release, "examples/word-count/lines")
                pod, code, output = await asyncio.to_thread(
                    release.run_job, f"{RELEASE}-spark-export-lines")
                assert code == 0, output
                exported = release.workdir / "pods" / pod.name / "tmp" / "export" / "lines"
                assert list(exported.rglob("*.parquet")), output
                await helm_uninstall(release, kubectl, rendered)
                await asyncio.to_thread(stops_cleanly, release)
            finally:
                await asyncio.to_thread(release.stop_all)
    finally:
        s3.stop()
