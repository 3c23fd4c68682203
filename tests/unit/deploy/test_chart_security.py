"""The chart's TLS, authorization, etcd TLS, NetworkPolicies and RBAC, rendered by a real
Helm: off by default (nothing of them in the default, full or dev installs); with a TLS
Secret or cert-manager, brokers and consumers mount it as a directory, get TLS_* and
probe /healthz over HTTPS (or, under mutual TLS, with an exec probe presenting their own
certificate, run here against a real mTLS server), and advertise a DNS name their
Certificate covers (the rendered shell line, run); Certificates are well formed; auth
mounts the keys (or gives a consumer a token); etcd serves TLS with its clients' env;
NetworkPolicies let only the release's own pods reach etcd; no Role has a wildcard; values
that need a Secret's name fail naming it; the documented install renders."""

from __future__ import annotations

import fnmatch
import http.server
import re
import shlex
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.fixtures.helm import Helm
from tests.unit.deploy.test_chart import (
    CHART,
    ROOT,
    VALUES,
    assert_valid_kubernetes,
    containers,
    named,
    of_kind,
    pod_specs,
    render,
)

TLS = ["--set", "tls.enabled=true", "--set", "tls.secretName=gazette-tls",
       "--set", "consumer.enabled=true"]
SECURE = VALUES["secure"]
SECURITY_ENV = ("TLS_", "AUTH_", "ETCD_CERT_FILE", "ETCD_KEY_FILE", "ETCD_CA_FILE")
#: cert-manager.io/v1 CertificateSpec's fields and KeyUsage values (its CRD's schema).
CERTIFICATE_FIELDS = {
    "secretName", "secretTemplate", "duration", "renewBefore", "commonName", "dnsNames",
    "ipAddresses", "uris", "emailAddresses", "subject", "privateKey", "usages",
    "issuerRef", "isCA", "keystores", "literalSubject", "otherNames",
    "revisionHistoryLimit", "encodeUsagesInRequest", "additionalOutputFormats",
    "nameConstraints", "renewBeforePercentage", "signatureAlgorithm"}
KEY_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment",
    "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
    "decipher only", "any", "server auth", "client auth", "code signing", "email protection",
    "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping",
    "ocsp signing", "microsoft sgc", "netscape sgc"}
DNS_NAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$")


def main_container(objects: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    main: dict[str, Any]
    [main] = named(objects, "Deployment", suffix)["spec"]["template"]["spec"]["containers"]
    return main


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def secret_mounts(objects: list[dict[str, Any]], suffix: str,
                  kind: str = "Deployment") -> dict[str, tuple[str, dict[str, Any]]]:
    """The Secret volumes of a workload's main container: Secret name -> (where it is
    mounted, the mount)."""
    pod = named(objects, kind, suffix)["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", [])
               if "secret" in v}
    return {secrets[m["name"]]: (m["mountPath"], m) for m in pod["containers"][0]["volumeMounts"]
            if m["name"] in secrets}


def assert_valid(objects: list[dict[str, Any]]) -> None:
    for o in objects:
        if o["apiVersion"].startswith(("gazette-py.dev/", "kopf.dev/", "apiextensions",
                                       "cert-manager.io/")):
            continue
        assert_valid_kubernetes(o)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions In/NotIn/Exists) against labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        value = labels.get(e["key"])
        ok = {"In": value in e.get("values", []), "NotIn": value not in e.get("values", []),
              "Exists": e["key"] in labels, "DoesNotExist": e["key"] not in labels}[e["operator"]]
        if not ok:
            return False
    return True


def covers(names: list[str], host: str) -> bool:
    """Whether a certificate's DNS names cover `host` (a wildcard stands for one label)."""
    return any(fnmatch.fnmatchcase(host, n) and host.count(".") == n.count(".") for n in names)


def test_the_default_installs_have_no_tls_auth_or_policies(helm: Helm) -> None:
    for values in ("default", "full", "dev"):
        objects = render(helm, VALUES[values])
        assert not of_kind(objects, "NetworkPolicy") and not of_kind(objects, "Certificate")
        for name, pod in pod_specs(objects):
            assert not [v for v in pod["spec"].get("volumes", []) if "secret" in v
                        and v["name"] in ("tls", "auth-keys", "etcd-tls")], name
            for c in containers(pod):
                assert not [e for e in env_of(c) if e.startswith(SECURITY_ENV)], (name, c["name"])
                if "ETCD_ADDRESS" in env_of(c):
                    assert env_of(c)["ETCD_ADDRESS"].startswith("http://")
        for suffix in ("-broker", "-consumer-word-count"):
            if not [d for d in of_kind(objects, "Deployment")
                    if d["metadata"]["name"].endswith(suffix)]:
                continue
            main = main_container(objects, suffix)
            assert main["readinessProbe"]["grpc"] == {"port": 8080}
            assert not {"POD_IP"} & set(env_of(main))


def test_tls_from_a_secret_mounts_it_and_probes_over_https(helm: Helm) -> None:
    objects = render(helm, None, *TLS)
    assert_valid(objects)
    for suffix, host_var in (("-broker", "BROKER_HOST"), ("-consumer-word-count", "CONSUMER_HOST")):
        main = main_container(objects, suffix)
        env = env_of(main)
        # The Secret is a directory (no subPath: a renewed certificate reaches the pod)...
        [(path, mount)] = secret_mounts(objects, suffix).values()
        assert secret_mounts(objects, suffix).keys() == {"gazette-tls"}
        assert "subPath" not in mount and mount["readOnly"]
        # ... and the env names its files.
        assert {k: v for k, v in env.items() if k.startswith("TLS_")} == {
            "TLS_CERT_FILE": f"{path}/tls.crt", "TLS_KEY_FILE": f"{path}/tls.key",
            "TLS_CA_FILE": f"{path}/ca.crt", "TLS_CLIENT_AUTH": "false"}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert main[probe]["httpGet"] == {"path": "/healthz", "port": "http",
                                              "scheme": "HTTPS"}, (suffix, probe)
        # The advertised host is made from the pod's IP by the command (below).
        assert host_var not in env and env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert host_var in main["command"][-1]
        pod = named(objects, "Deployment", suffix)["spec"]["template"]
        assert pod["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    # Each broker's name lives under a headless Service that keeps unready brokers.
    peers = named(objects, "Service", "-broker-peers")
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    assert {p["appProtocol"] for p in named(objects, "Service", "rel-gazette-broker")["spec"][
        "ports"]} == {"grpc", "https"}


@pytest.mark.parametrize(("pod_ip", "label"), [("10.1.2.3", "10-1-2-3"),
                                               ("fd00:10:244::1f", "fd00-10-244--1f")])
def test_members_advertise_a_name_their_certificate_covers(helm: Helm, tmp_path: Path,
                                                           pod_ip: str, label: str) -> None:
    """The rendered shell lines, run by /bin/sh with `gazette` and `python` stubbed: the
    broker and the consumer start with the DNS name CoreDNS keeps for their IP under
    their headless Service, which their cert-manager Certificate covers."""
    objects = render(helm, SECURE)
    for suffix, host_var, exe, service in (
            ("-broker", "BROKER_HOST", "gazette", "rel-gazette-broker-peers"),
            ("-consumer-word-count", "CONSUMER_HOST", "python", "rel-gazette-consumer-word-count")):
        main = main_container(objects, suffix)
        assert main["command"][:2] == ["/bin/sh", "-c"]
        stub = tmp_path / exe
        stub.write_text(f'#!/bin/sh\necho "$@ as ${host_var} in $BROKER_ZONE"\n')
        stub.chmod(0o755)
        zone = tmp_path / "zone"
        zone.write_text("zone-a")
        script = main["command"][-1].replace("/var/run/gazette/zone", str(zone))
        proc = subprocess.run([*main["command"][:-1], script], capture_output=True, text=True,
                              env={"PATH": f"{tmp_path}:/usr/bin:/bin", "POD_IP": pod_ip},
                              check=True, timeout=30)
        host = f"{label}.{service}.streaming.svc"
        args = "serve" if exe == "gazette" else "-m gazette_consumer serve"
        zone_name = "zone-a" if exe == "gazette" else ""
        assert proc.stdout == f"{args} as {host} in {zone_name}\n"
        certificate = named(objects, "Certificate", f"{suffix}-tls")
        assert covers(certificate["spec"]["dnsNames"], host)
        assert covers(certificate["spec"]["dnsNames"], f"{host}.cluster.local")


def test_cert_manager_certificates_are_well_formed(helm: Helm) -> None:
    objects = render(helm, SECURE)
    certificates = {c["metadata"]["name"]: c for c in of_kind(objects, "Certificate")}
    assert set(certificates) == {"rel-gazette-broker-tls", "rel-gazette-consumer-word-count-tls",
                                 "rel-gazette-etcd-tls", "rel-gazette-etcd-client-tls"}
    for name, c in certificates.items():
        spec = c["spec"]
        assert c["apiVersion"] == "cert-manager.io/v1"
        assert set(spec) <= CERTIFICATE_FIELDS, name
        assert spec["secretName"] == name
        assert spec["issuerRef"] == {"name": "gazette-ca", "kind": "ClusterIssuer",
                                     "group": "cert-manager.io"}
        assert DURATION.match(spec["duration"]) and DURATION.match(spec["renewBefore"])
        assert (int(spec["renewBefore"].rstrip("h")), int(spec["duration"].rstrip("h"))) == (
            240, 720)
        assert set(spec["usages"]) <= KEY_USAGES and "client auth" in spec["usages"]
        assert spec["privateKey"]["rotationPolicy"] == "Always"
        assert spec.get("dnsNames") or spec.get("commonName"), name
        for dns in spec.get("dnsNames", []):
            assert DNS_NAME.match(dns) and len(dns) <= 253, dns
    # Members: servers and clients, covering their Services in every form.
    broker = certificates["rel-gazette-broker-tls"]["spec"]
    assert {"server auth", "client auth"} <= set(broker["usages"])
    for host in ("rel-gazette-broker", "rel-gazette-broker.streaming",
                 "rel-gazette-broker.streaming.svc",
                 "rel-gazette-broker.streaming.svc.cluster.local",
                 "10-0-0-7.rel-gazette-broker-peers.streaming.svc"):
        assert covers(broker["dnsNames"], host), host
    # The consumer dials the brokers' Service by a name their certificate covers.
    consumer = main_container(objects, "-consumer-word-count")
    assert covers(broker["dnsNames"], env_of(consumer)["BROKER_ADDRESS"].split(":")[0])
    # Each pod mounts the Secret its Certificate writes.
    assert "rel-gazette-broker-tls" in secret_mounts(objects, "-broker")
    assert "rel-gazette-consumer-word-count-tls" in secret_mounts(objects, "-consumer-word-count")
    # etcd's certificate covers what its clients dial and what it advertises.
    etcd = certificates["rel-gazette-etcd-tls"]["spec"]
    assert covers(etcd["dnsNames"], env_of(consumer)["ETCD_ADDRESS"].split("//")[1].split(":")[0])
    assert covers(etcd["dnsNames"], "rel-gazette-etcd-2.rel-gazette-etcd-peers.streaming.svc")
    assert "server auth" in etcd["usages"]
    assert certificates["rel-gazette-etcd-client-tls"]["spec"]["usages"] == [
        "digital signature", "client auth"]


def test_tls_without_a_secret_or_cert_manager_renders_no_certificate(helm: Helm) -> None:
    objects = render(helm, None, *TLS)
    assert not of_kind(objects, "Certificate")
    # cert-manager for etcd alone: only etcd's certificates.
    etcd_only = render(helm, None, "--set", "etcd.tls.enabled=true", "--set",
                       "tls.certManager.enabled=true", "--set",
                       "tls.certManager.issuerRef.name=ca")
    assert {c["metadata"]["name"] for c in of_kind(etcd_only, "Certificate")} == {
        "rel-gazette-etcd-tls", "rel-gazette-etcd-client-tls"}
    assert "TLS_CERT_FILE" not in env_of(main_container(etcd_only, "-broker"))


@pytest.fixture
def mtls(tmp_path: Path) -> Iterator[tuple[int, dict[str, str], list[int]]]:
    """An HTTPS server on localhost requiring client certificates of a trustme CA: its
    port, the env of a client holding such a certificate (as a pod's TLS_* name its
    files), and a list whose last item is the status /healthz answers."""
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("rel-gazette-broker.streaming.svc")
    files = {"ca.crt": ca.cert_pem, "tls.crt": client.cert_chain_pems[0],
             "tls.key": client.private_key_pem}
    for name, blob in files.items():
        blob.write_to_path(str(tmp_path / name))
    status = [200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status[-1] if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.configure_cert(ctx)
    ca.configure_trust(ctx)
    ctx.verify_mode = ssl.CERT_REQUIRED
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    env = {"TLS_CA_FILE": str(tmp_path / "ca.crt"), "TLS_CERT_FILE": str(tmp_path / "tls.crt"),
           "TLS_KEY_FILE": str(tmp_path / "tls.key")}
    try:
        yield httpd.server_address[1], env, status
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_mutual_tls_probes_run_in_the_pod_with_its_certificate(
        helm: Helm, mtls: tuple[int, dict[str, str], list[int]], tmp_path: Path) -> None:
    """The kubelet presents no client certificate, so under clientAuth the probes are the
    container's Python GETting /healthz with the pod's own certificate: run here against
    an mTLS server, they pass on 200, fail on 503 and fail with a foreign certificate."""
    port, env, status = mtls
    objects = render(helm, None, *TLS, "--set", "tls.clientAuth=true",
                     "--set", f"broker.httpPort={port}", "--set", f"consumer.httpPort={port}")
    assert_valid(objects)
    for suffix in ("-broker", "-consumer-word-count"):
        main = main_container(objects, suffix)
        assert env_of(main)["TLS_CLIENT_AUTH"] == "true"
        probes = [main[p] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
        assert all(p["exec"] == probes[0]["exec"] and p["timeoutSeconds"] >= 5 for p in probes)
        command = probes[0]["exec"]["command"]
        assert command[:2] == ["python", "-c"]

        def probe(extra: dict[str, str] | None = None, cmd: list[str] = command) -> int:
            return subprocess.run([sys.executable, *cmd[1:]], env={**env, **(extra or {})},
                                  capture_output=True, timeout=30, check=False).returncode

        status.append(200)
        assert probe() == 0
        status.append(503)
        assert probe() != 0
        status.append(200)
        other = trustme.CA().issue_cert("intruder")
        other.cert_chain_pems[0].write_to_path(str(tmp_path / "other.crt"))
        other.private_key_pem.write_to_path(str(tmp_path / "other.key"))
        assert probe({"TLS_CERT_FILE": str(tmp_path / "other.crt"),
                      "TLS_KEY_FILE": str(tmp_path / "other.key")}) != 0
    # `tls.probes: https` keeps the kubelet's HTTPS probe under clientAuth.
    https = render(helm, None, *TLS, "--set", "tls.clientAuth=true", "--set", "tls.probes=https")
    assert main_container(https, "-broker")["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_auth_mounts_the_keys_as_a_directory(helm: Helm) -> None:
    objects = render(helm, None, "--set", "auth.enabled=true", "--set",
                     "auth.keysSecret=gazette-auth", "--set", "auth.keysSecretKey=signing",
                     "--set", "consumer.enabled=true")
    assert_valid(objects)
    for suffix in ("-broker", "-consumer-word-count"):
        mounts = secret_mounts(objects, suffix)
        assert set(mounts) == {"gazette-auth"}
        path, mount = mounts["gazette-auth"]
        assert "subPath" not in mount and mount["readOnly"]
        env = env_of(main_container(objects, suffix))
        assert env["AUTH_KEYS_FILE"] == f"{path}/signing"
        assert "AUTH_TOKEN" not in env
    # The operator talks to etcd only: no keys.
    assert not secret_mounts(objects, "-operator")
    # A consumer given a token gets it from its Secret and holds no keys.
    token = render(helm, None, "--set", "auth.enabled=true", "--set",
                   "auth.keysSecret=gazette-auth", "--set", "consumer.enabled=true",
                   "--set", "consumer.auth.tokenSecret=word-count-token")
    env = env_of(main_container(token, "-consumer-word-count"))
    assert env["AUTH_TOKEN"] == {"secretKeyRef": {"name": "word-count-token", "key": "token"}}
    assert "AUTH_KEYS_FILE" not in env and not secret_mounts(token, "-consumer-word-count")
    assert "AUTH_KEYS_FILE" in env_of(main_container(token, "-broker"))


def test_etcd_serves_tls_and_its_clients_present_certificates(helm: Helm) -> None:
    objects = render(helm, SECURE)
    [member] = of_kind(objects, "StatefulSet")
    [etcd] = member["spec"]["template"]["spec"]["containers"]
    args = dict(a.split("=", 1) if "=" in a else (a, "") for a in etcd["args"])
    [(server_dir, _)] = secret_mounts(objects, "rel-gazette-etcd", "StatefulSet").values()
    assert secret_mounts(objects, "rel-gazette-etcd", "StatefulSet").keys() == {
        "rel-gazette-etcd-tls"}
    assert args["--listen-client-urls"].startswith("https://")
    assert args["--advertise-client-urls"].startswith("https://")
    assert (args["--cert-file"], args["--key-file"], args["--trusted-ca-file"]) == (
        f"{server_dir}/tls.crt", f"{server_dir}/tls.key", f"{server_dir}/ca.crt")
    assert "--client-cert-auth" in args
    # Probes use the plain-HTTP metrics listener: the client port wants a certificate.
    ports = {p["name"]: p["containerPort"] for p in etcd["ports"]}
    assert args["--listen-metrics-urls"] == f"http://0.0.0.0:{ports['metrics']}"
    for probe in ("readinessProbe", "livenessProbe"):
        assert etcd[probe]["httpGet"]["port"] == "metrics"
    # Brokers, the consumer and the operator dial https:// with the client certificate.
    for suffix in ("-broker", "-consumer-word-count", "-operator"):
        env = env_of(main_container(objects, suffix))
        path, mount = secret_mounts(objects, suffix)["rel-gazette-etcd-client-tls"]
        assert "subPath" not in mount
        assert env["ETCD_ADDRESS"] == "https://rel-gazette-etcd.streaming.svc:2379"
        assert (env["ETCD_CERT_FILE"], env["ETCD_KEY_FILE"], env["ETCD_CA_FILE"]) == (
            f"{path}/tls.crt", f"{path}/tls.key", f"{path}/ca.crt")
        pod = named(objects, "Deployment", suffix)["spec"]["template"]["spec"]
        assert pod["securityContext"]["fsGroup"] == 10001  # the files are 0440
    # Secrets of one's own.
    own = render(helm, None, "--set", "etcd.tls.enabled=true",
                 "--set", "etcd.tls.secretName=etcd-server",
                 "--set", "etcd.tls.clientSecretName=etcd-client",
                 "--set", "etcd.tls.clientAuth=false")
    assert_valid(own)
    assert not of_kind(own, "Certificate")
    [etcd] = of_kind(own, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"]
    assert "--client-cert-auth" not in etcd["args"]
    assert secret_mounts(own, "rel-gazette-etcd", "StatefulSet").keys() == {"etcd-server"}
    assert secret_mounts(own, "-operator").keys() == {"etcd-client"}


def test_network_policies_let_only_the_release_reach_etcd(helm: Helm) -> None:
    objects = render(helm, SECURE)
    assert_valid(objects)
    pods = {name: pod["metadata"]["labels"] for name, pod in pod_specs(objects)}
    policy = named(objects, "NetworkPolicy", "-etcd")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert {n for n, labels in pods.items()
            if selects(policy["spec"]["podSelector"], labels)} == {"rel-gazette-etcd"}
    [member] = of_kind(objects, "StatefulSet")
    etcd_ports = {p["name"] for p in member["spec"]["template"]["spec"]["containers"][0]["ports"]}
    reach: dict[str, set[str]] = {}
    for rule in policy["spec"]["ingress"]:
        [port] = [p["port"] for p in rule["ports"]]
        assert port in etcd_ports
        ours = [p for p in rule["from"] if "podSelector" in p and "namespaceSelector" not in p
                and p["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/instance")]
        reach[port] = {n for n, labels in pods.items()
                       if any(selects(p["podSelector"], labels) for p in ours)}
    assert reach == {
        "client": {"rel-gazette-broker", "rel-gazette-consumer-word-count",
                   "rel-gazette-operator"},
        "peer": {"rel-gazette-etcd"}}
    # etcdExtraFrom joins the client port's sources; the brokers' policy is the namespace.
    [client_rule] = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "client"]
    assert {"podSelector": {"matchLabels": {"app": "my-consumer"}}} in client_rule["from"]
    brokers = named(objects, "NetworkPolicy", "-broker")
    assert {n for n, labels in pods.items()
            if selects(brokers["spec"]["podSelector"], labels)} == {"rel-gazette-broker"}
    [rule] = brokers["spec"]["ingress"]
    assert rule["from"][0] == {"podSelector": {}}
    assert {p["port"] for p in rule["ports"]} == {"grpc", "http"}
    # Without a consumer or an operator, the policy names only the brokers.
    lean = render(helm, None, "--set", "networkPolicy.enabled=true",
                  "--set", "operator.enabled=false")
    [policy] = of_kind(lean, "NetworkPolicy")
    expression = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]
    assert expression["values"] == ["broker"]


@pytest.mark.parametrize("values", ["default", "full", "dev", "secure"])
def test_no_role_has_a_wildcard(helm: Helm, values: str, tmp_path: Path) -> None:
    objects = render(helm, VALUES[values])
    roles = [o for o in objects if o["kind"] in ("Role", "ClusterRole")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames",
                          "nonResourceURLs"):
                assert not [v for v in rule.get(field, []) if "*" in v], (
                    role["metadata"]["name"], rule)
    # The operator patches its resources' status, never reads it alone (kopf reads the
    # whole resource).
    operator = [r for r in roles if r["metadata"]["labels"]["app.kubernetes.io/component"]
                == "operator"]
    for role in operator:
        [status] = [r for r in role["rules"] if "journalspecs/status" in r["resources"]]
        assert status["verbs"] == ["patch"]


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "tls.enabled=true"], "tls.secretName: required when tls.enabled"),
    (["--set", "tls.clientAuth=true"], "tls.clientAuth: needs tls.enabled"),
    (["--set", "tls.enabled=true", "--set", "tls.certManager.enabled=true"],
     "tls.certManager.issuerRef.name: required"),
    (["--set", "auth.enabled=true"], "auth.keysSecret: required when auth.enabled"),
    (["--set", "etcd.tls.enabled=true"], "etcd.tls.secretName: required when etcd.tls.enabled"),
    (["--set", "etcd.tls.enabled=true", "--set", "etcd.tls.secretName=s"],
     "etcd.tls.clientSecretName: required"),
    (["--set", "tls.probes=tcp"], "/tls/probes"),
    (["--set", "tls.certManager.duration=90d"], "/tls/certManager/duration"),
    (["--set", "auth.keysSecret=Bad_Name"], "/auth/keysSecret"),
    (["--set", "networkPolicy.etcdExtraFrom[0].pods=x"], "'pods' not allowed"),
])
def test_missing_or_bad_security_values_fail_naming_the_key(helm: Helm, args: list[str],
                                                            message: str) -> None:
    proc = helm("template", "rel", CHART, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_the_documented_tls_install_renders(helm: Helm, tmp_path: Path) -> None:
    """The `helm install` with TLS and auth in docs/kubernetes.md: its --set flags render
    TLS and auth as documented."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    [block] = [b for b in text.split("```") if "--set tls.enabled=true" in b]
    [line] = [cmd for cmd in block.replace("\\\n", " ").splitlines()
              if "helm install" in cmd and "tls.enabled" in cmd]
    words = shlex.split(line.split("$", 1)[1] if "$" in line else line)
    sets = [w for i, w in enumerate(words) if i and words[i - 1] == "--set"]
    assert sets
    objects = render(helm, None, *[a for s in sets for a in ("--set", s)])
    env = env_of(main_container(objects, "-broker"))
    assert env["TLS_CERT_FILE"] and env["AUTH_KEYS_FILE"]
    assert of_kind(objects, "Certificate")


def test_the_probe_script_port_is_the_http_port(helm: Helm) -> None:
    """A sanity check of the probe's target: the container's own HTTP port on localhost."""
    objects = render(helm, None, *TLS, "--set", "tls.clientAuth=true")
    main = main_container(objects, "-broker")
    script = main["readinessProbe"]["exec"]["command"][-1]
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert f"https://localhost:{ports['http']}/healthz" in script
    compile(script, "probe", "exec")
