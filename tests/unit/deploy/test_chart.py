"""The Helm chart, rendered by a real Helm: `helm lint --strict` passes; every object of
the default, full-featured, dev and secure (TLS, auth, etcd TLS, NetworkPolicies) installs
is valid Kubernetes (kubernetes-validate,
strict, offline, at the chart's oldest and the newest supported version); every custom
resource passes its CRD's schema and our own validation; the wiring holds (selectors,
the etcd endpoint, probes, least-privilege RBAC); bad values fail with the key's path."""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gazette.errors import ValidationError
from gazette.protocol import JournalSpec
from gazette_operator.sync import declared
from tests.fixtures.helm import Helm

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "gazette"
VALUES = {"default": None, "full": CHART / "ci" / "full-values.yaml",
          "dev": CHART / "values-dev.yaml", "secure": CHART / "ci" / "secure-values.yaml"}
#: The chart's kubeVersion floor and the newest schemas kubernetes-validate has.
KUBE_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
WORKLOADS = {"Deployment", "StatefulSet", "Job"}
#: API groups whose CRDs are not the chart's (kubernetes-validate knows neither):
#: test_chart_security checks cert-manager's Certificates field by field.
FOREIGN_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/")


def render(helm: Helm, values: Path | None, *extra: str) -> list[dict[str, Any]]:
    args = ["template", "rel", CHART, "--namespace", "streaming", "--include-crds", *extra]
    if values is not None:
        args += ["--values", values]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


@pytest.fixture(scope="module", params=list(VALUES), ids=list(VALUES))
def rendered(request: pytest.FixtureRequest, helm: Helm) -> list[dict[str, Any]]:
    return render(helm, VALUES[request.param])


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    """The one object of `kind` whose name ends with `suffix`."""
    [found] = [o for o in of_kind(objects, kind) if o["metadata"]["name"].endswith(suffix)]
    return found


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objects:
        if o["kind"] in WORKLOADS:
            yield o["metadata"]["name"], o["spec"]["template"]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


@pytest.mark.parametrize("values", list(VALUES))
def test_helm_lint_strict_passes(helm: Helm, values: str) -> None:
    args = ["lint", "--strict", CHART]
    if VALUES[values] is not None:
        args += ["--values", VALUES[values]]
    assert "0 chart(s) failed" in helm(*args).stdout


def test_every_object_is_valid_kubernetes(rendered: list[dict[str, Any]]) -> None:
    crds = {f"{c['spec']['group']}/{c['spec']['versions'][0]['name']}/{c['spec']['names']['kind']}"
            for c in of_kind(rendered, "CustomResourceDefinition")}
    checked = 0
    for o in rendered:
        if f"{o['apiVersion']}/{o['kind']}" in crds or o["apiVersion"].startswith(FOREIGN_GROUPS):
            continue  # custom resources: checked against their CRD below
        assert_valid_kubernetes(o)
        checked += 1
    assert checked >= 10


def assert_valid_kubernetes(o: dict[str, Any]) -> None:
    """`o` is a valid built-in object for every version in `KUBE_VERSIONS`."""
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{o['kind']} {o['metadata']['name']} (Kubernetes {version}): "
                        f"{'.'.join(map(str, err.path))}: {err.message}")


def test_every_custom_resource_passes_its_crd_and_our_validation(
        rendered: list[dict[str, Any]]) -> None:
    schemas = {(c["spec"]["group"], c["spec"]["names"]["kind"]):
               c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
               for c in of_kind(rendered, "CustomResourceDefinition")}
    assert ("gazette-py.dev", "JournalSpec") in schemas
    assert ("kopf.dev", "ClusterKopfPeering") in schemas
    for o in rendered:
        group = o["apiVersion"].split("/")[0]
        if (group, o["kind"]) not in schemas:
            continue
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in
                  jsonschema.Draft7Validator(schemas[group, o["kind"]]).iter_errors(o)]
        assert errors == [], f"{o['kind']} {o['metadata']['name']}"
        if group == "gazette-py.dev":
            declared(o["kind"], o["spec"])  # raises ValidationError naming the field


def test_the_full_install_declares_journals_and_shards(helm: Helm) -> None:
    objects = render(helm, VALUES["full"])
    journals = {o["metadata"]["name"]: o["spec"] for o in of_kind(objects, "JournalSpec")}
    assert set(journals) == {"example-journal", "foobar-zero", "foobar-part-000-upper"}
    # A templated store names the MinIO bucket; the brokers are given MinIO's endpoint.
    assert journals["example-journal"]["fragment"]["stores"][0] == "s3://gazette/"
    [broker] = named(objects, "Deployment", "-broker")["spec"]["template"]["spec"]["containers"]
    assert {"name": "AWS_ENDPOINT_URL_S3",
            "value": "http://rel-gazette-minio.streaming.svc:9000"} in broker["env"]
    assert "resourceName" not in journals["foobar-zero"]
    [shard] = of_kind(objects, "ShardSpec")
    assert shard["spec"]["app"] == "word-count"
    key = declared("ShardSpec", shard["spec"]).key
    assert key.endswith("/word-count/items/word-count/part-000")


def test_selectors_match_their_pods(rendered: list[dict[str, Any]]) -> None:
    pods = [pod["metadata"]["labels"] for _, pod in pod_specs(rendered)]

    def matches(selector: dict[str, str]) -> bool:
        return any(selector.items() <= labels.items() for labels in pods)

    for o in rendered:
        if o["kind"] == "Service":
            assert matches(o["spec"]["selector"]), o["metadata"]["name"]
        elif o["kind"] in ("PodDisruptionBudget", "Deployment", "StatefulSet"):
            selector = o["spec"]["selector"]["matchLabels"]
            assert matches(selector), o["metadata"]["name"]
            if o["kind"] != "PodDisruptionBudget":
                assert selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()


def test_components_reach_etcd_through_its_service(rendered: list[dict[str, Any]]) -> None:
    etcd = named(rendered, "Service", "rel-gazette-etcd")
    [member] = of_kind(rendered, "StatefulSet")
    [listen] = [a for a in member["spec"]["template"]["spec"]["containers"][0]["args"]
                if a.startswith("--listen-client-urls=")]
    scheme = listen.split("=", 1)[1].split("://")[0]  # https under etcd.tls
    endpoint = f"{scheme}://rel-gazette-etcd.streaming.svc:{etcd['spec']['ports'][0]['port']}"
    users = 0
    for _, pod in pod_specs(rendered):
        for c in containers(pod):
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if "ETCD_ADDRESS" in env:
                assert env["ETCD_ADDRESS"] == endpoint
                users += 1
    assert users >= 2  # brokers and the operator


def test_containers_are_bounded_and_unprivileged(rendered: list[dict[str, Any]]) -> None:
    for name, pod in pod_specs(rendered):
        for c in containers(pod):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"], (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"]
            if pod["spec"].get("restartPolicy") != "OnFailure":  # long-running pods
                assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


def test_brokers_probe_grpc_health_and_outlast_their_drain(helm: Helm) -> None:
    objects = render(helm, None, "--set", "broker.drainTimeout=90")
    broker = named(objects, "Deployment", "-broker")
    pod = broker["spec"]["template"]["spec"]
    [main] = pod["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["grpc"]["port"] == 8080
    assert pod["terminationGracePeriodSeconds"] > 90
    env = {e["name"]: e.get("value") or e.get("valueFrom") for e in main["env"]}
    assert env["BROKER_DRAIN_TIMEOUT"] == "90"
    assert env["BROKER_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["BROKER_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert broker["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_the_broker_zone_comes_from_the_node_label(helm: Helm) -> None:
    objects = render(helm, None)
    broker = named(objects, "Deployment", "-broker")
    pod = broker["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    module = init["command"][-1]
    assert init["command"][:2] == ["python", "-m"] and importlib.util.find_spec(module)
    assert "--label=topology.kubernetes.io/zone" in init["args"]
    assert {"name": "NODE_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in init["env"]
    # The broker reads what the init container wrote, from the volume they share.
    [main] = pod["containers"]
    assert "/var/run/gazette/zone" in main["command"][-1] and "gazette serve" in main["command"][-1]
    shared = {m["name"] for m in init["volumeMounts"]} & {m["name"] for m in main["volumeMounts"]}
    assert shared == {"zone"}
    # Only the init container holds the API token, and the broker may only get nodes.
    assert main["command"][:2] == ["/bin/sh", "-c"]
    assert pod["automountServiceAccountToken"] is False
    assert "kube-api" not in {m["name"] for m in main["volumeMounts"]}
    [role] = [r for r in of_kind(objects, "ClusterRole") if "broker" in r["metadata"]["name"]]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    # A fixed zone needs neither.
    fixed = render(helm, None, "--set", "broker.zone.fromNodeLabel=",
                   "--set", "broker.zone.default=zone-a")
    broker = named(fixed, "Deployment", "-broker")
    assert "initContainers" not in broker["spec"]["template"]["spec"]
    [main] = broker["spec"]["template"]["spec"]["containers"]
    assert {"name": "BROKER_ZONE", "value": "zone-a"} in main["env"]
    assert not [r for r in of_kind(fixed, "ClusterRole") if "broker" in r["metadata"]["name"]]


def test_the_operator_has_least_privilege(helm: Helm) -> None:
    cluster = render(helm, None, "--set", "operator.watchAllNamespaces=true")
    [role] = [r for r in of_kind(cluster, "ClusterRole") if "operator" in r["metadata"]["name"]]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert not any("*" in item for item in granted)
    assert {v for g, r, v in granted if r == "journalspecs"} == {"get", "list", "watch", "patch"}
    assert {v for g, r, v in granted if r == "events"} == {"create"}
    assert {r for g, r, v in granted} == {"journalspecs", "shardspecs", "journalspecs/status",
                                          "shardspecs/status", "events", "clusterkopfpeerings"}
    [peering] = of_kind(cluster, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "streaming-rel-gazette-operator"
    # Watching listed namespaces: a Role and a KopfPeering in each, nothing cluster-wide.
    namespaced = render(helm, VALUES["full"])
    assert not [r for r in of_kind(namespaced, "ClusterRole")
                if "operator" in r["metadata"]["name"]]
    for kind in ("Role", "RoleBinding", "KopfPeering"):
        assert {r["metadata"]["namespace"] for r in of_kind(namespaced, kind)
                if r["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"} == {
            "streaming", "analytics"}
    [main] = named(namespaced, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["WATCH_NAMESPACES"] == "streaming,analytics"


def test_etcd_runs_one_or_three_members(helm: Helm) -> None:
    [one] = of_kind(render(helm, None), "StatefulSet")
    assert one["spec"]["replicas"] == 1
    three_objects = render(helm, VALUES["full"])
    [three] = of_kind(three_objects, "StatefulSet")
    args = three["spec"]["template"]["spec"]["containers"][0]["args"]
    [initial] = [a for a in args if a.startswith("--initial-cluster=")]
    assert initial.count("=http://") == 3
    assert "rel-gazette-etcd-2=http://rel-gazette-etcd-2.rel-gazette-etcd-peers." in initial
    assert [p["spec"]["maxUnavailable"] for p in of_kind(three_objects, "PodDisruptionBudget")
            if "etcd" in p["metadata"]["name"]] == [1]


def test_images_follow_registry_and_tags(helm: Helm) -> None:
    images = {c["image"] for _, pod in pod_specs(render(helm, VALUES["full"]))
              for c in containers(pod)}
    assert "registry.example.com/gazette/gazette-operator:0.1.0-rc1" in images
    assert any(i.startswith("registry.example.com/gazette/gazette-broker@sha256:") for i in images)
    defaults = {c["image"] for _, pod in pod_specs(render(helm, None)) for c in containers(pod)}
    assert "gazette-broker:0.1.0" in defaults
    # The registry prefixes our images only: etcd's and MinIO's name their own registry
    # (it was prefixed to them too: registry.example.com/gazette/quay.io/coreos/etcd).
    assert {i for i in images if "quay.io" in i} == {
        "quay.io/coreos/etcd:v3.5.21", "quay.io/minio/minio:RELEASE.2025-09-07T16-13-09Z",
        "quay.io/minio/mc:RELEASE.2025-08-13T08-35-41Z"}


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "etcd.replicas=2"], "/etcd/replicas"),
    (["--set", "broker.replicaz=2"], "'replicaz' not allowed"),
    (["--set", "consumer.enabled=true", "--set", "consumer.app="], "consumer.app: required"),
    (["--set", "journals[0].name=a/b", "--set", "journals[1].name=a-b"],
     'journals[1]: resource name "a-b" is taken by journals[0]'),
    (["--set", "journals[0].replication=2"], "name"),
    (["--set", "minio.bucket=Bad_Bucket"], "/minio/bucket"),
])
def test_bad_values_fail_naming_the_key(helm: Helm, args: list[str], message: str) -> None:
    proc = helm("template", "rel", CHART, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_a_bad_journal_in_values_is_refused_by_the_crd_schema(helm: Helm) -> None:
    """Helm renders what it is given; the API server's CRD schema (what we check here)
    refuses the resource at install, naming the field."""
    objects = render(helm, None, "--set", "journals[0].name=a/b", "--set",
                     "journals[0].replication=0")
    [crd] = [c for c in of_kind(objects, "CustomResourceDefinition")
             if c["spec"]["names"]["kind"] == "JournalSpec"]
    [journal] = of_kind(objects, "JournalSpec")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    errors = [".".join(map(str, e.absolute_path))
              for e in jsonschema.Draft7Validator(schema).iter_errors(journal)]
    assert errors == ["spec.replication"]
    with pytest.raises(ValidationError, match=r"spec\.replication"):
        declared("JournalSpec", journal["spec"])


def test_the_documented_values_example_renders_valid_journals(helm: Helm,
                                                              tmp_path: Path) -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    [example] = [block.split("```")[0] for block in text.split("```yaml\n")[1:]]
    values = tmp_path / "values.yaml"
    values.write_text(example + "minio: {enabled: true}\n")
    [journal] = of_kind(render(helm, values), "JournalSpec")
    assert journal["metadata"]["name"] == "clicks-part-000"
    spec = declared("JournalSpec", journal["spec"]).spec
    assert isinstance(spec, JournalSpec) and spec.replication == 3


def test_the_broker_command_passes_the_zone_file_on(helm: Helm, tmp_path: Path) -> None:
    """The rendered shell command, run by /bin/sh with the zone file and `gazette` stubbed:
    the broker starts with BROKER_ZONE from the file."""
    [main] = named(render(helm, None), "Deployment", "-broker")["spec"]["template"]["spec"][
        "containers"]
    zone = tmp_path / "zone"
    zone.write_text("eu-west-1a")
    stub = tmp_path / "gazette"
    stub.write_text('#!/bin/sh\necho "$@ in $BROKER_ZONE"\n')
    stub.chmod(0o755)
    script = main["command"][-1].replace("/var/run/gazette/zone", str(zone))
    proc = subprocess.run([*main["command"][:-1], script], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True, timeout=30)
    assert proc.stdout == "serve in eu-west-1a\n"


def test_the_consumer_runs_word_count_by_default_and_is_scraped(helm: Helm) -> None:
    """Enabled with defaults, the consumer Deployment runs the word-count example (an
    application its image can import), serves HTTP on the port its metrics are scraped
    from, and probes gRPC health."""
    from gazette_consumer.cli import load_app
    from gazette_consumer.examples.word_count import WordCount

    objects = render(helm, None, "--set", "consumer.enabled=true")
    (deployment,) = [d for d in of_kind(objects, "Deployment")
                     if d["metadata"]["name"].endswith("-consumer-word-count")]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CONSUMER_APP"] == "word-count"
    app, _ = load_app(env["CONSUMER_MODULE"])
    assert isinstance(app, WordCount)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert env["CONSUMER_HTTP_PORT"] == str(ports["http"])
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["http"])
    assert container["readinessProbe"]["grpc"]["port"] == ports["grpc"]
