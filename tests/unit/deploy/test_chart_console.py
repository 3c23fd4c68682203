"""The chart's web console (console.enabled), rendered by a real Helm: off by default;
on, a Deployment of the broker's image running ``gazette console`` and its Service, valid
Kubernetes, wired to the release's brokers and etcd (the command line it is given parses
into those addresses); under TLS, auth and etcd TLS, every file it is told of is in a
mounted Secret, and a NetworkPolicy lets it reach etcd; bad values fail naming the key."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from gazette.console.cli import add_parser, config_from_args
from gazette.console.config import CONSOLE_OPTIONS, Resolved
from gazette.serving.options import LOG_OPTIONS
from tests.fixtures.helm import Helm
from tests.unit.deploy.test_chart import (
    CHART,
    VALUES,
    assert_valid_kubernetes,
    named,
    of_kind,
    render,
)

ON = ("--set", "console.enabled=true")


def console_of(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The console's Deployment and its container."""
    deployment = named(objects, "Deployment", "-console")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_console_is_off_by_default(helm: Helm) -> None:
    """(ci/full-values.yaml turns every feature on, the console too.)"""
    for name, values in VALUES.items():
        if name == "full":
            continue
        objects = render(helm, values)
        assert not [o for o in objects if o["metadata"]["name"].endswith("-console")]


def test_the_console_runs_the_broker_image_against_the_release(helm: Helm) -> None:
    objects = render(helm, None, *ON)
    for o in objects:
        if o["metadata"]["name"].endswith("-console"):
            assert_valid_kubernetes(o)
    deployment, container = console_of(objects)
    [broker] = named(objects, "Deployment", "-broker")["spec"]["template"]["spec"][
        "containers"]
    assert container["image"] == broker["image"]
    assert container["command"] == ["gazette", "console"]
    env = env_of(container)
    broker_service = named(objects, "Service", "rel-gazette-broker")
    grpc = next(p["port"] for p in broker_service["spec"]["ports"] if p["name"] == "grpc")
    assert env["BROKER_ADDRESS"] == f"rel-gazette-broker.streaming.svc:{grpc}"
    assert env["ETCD_ADDRESS"] == env_of(broker)["ETCD_ADDRESS"]
    assert env["ETCD_PREFIX"] == env_of(broker)["ETCD_PREFIX"]
    assert "AUTH_TOKEN" not in env and "TLS_CA_FILE" not in env
    # Its Service reaches its pods' port; the probes ask /healthz there.
    service = named(objects, "Service", "-console")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    [port] = service["spec"]["ports"]
    assert port["targetPort"] == "http" and port["port"] == 8088
    assert container["ports"] == [{"name": "http", "containerPort": 8088}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["securityContext"]["readOnlyRootFilesystem"]


def test_every_variable_it_is_given_is_one_the_console_reads(
        helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod's environment, parsed as ``gazette console`` parses it: every variable
    is one of its options', and they make the release's addresses."""
    objects = render(helm, VALUES["full"], *ON, "--set",
                     "console.consumerAddress=word-count.streaming.svc:8080")
    _, container = console_of(objects)
    env = env_of(container)
    known = {o.env for o in (*CONSOLE_OPTIONS, *LOG_OPTIONS)}
    assert set(env) <= known, set(env) - known
    for name in known:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    config = config_from_args(parser.parse_args(["console"]))
    assert (config.port, config.bind) == (8088, "0.0.0.0")
    resolved = Resolved.of(config)
    assert resolved.broker.address == env["BROKER_ADDRESS"]
    assert resolved.consumer.address == "word-count.streaming.svc:8080"
    assert config.etcd_address.startswith("http://rel-gazette-etcd.streaming.svc:")


def test_secure_installs_give_it_tls_a_token_and_etcd(helm: Helm) -> None:
    objects = render(helm, VALUES["secure"], *ON, "--set",
                     "console.auth.tokenSecret=console-token")
    for o in objects:
        if o["metadata"]["name"].startswith("rel-gazette-console"):
            assert_valid_kubernetes(o)
    deployment, container = console_of(objects)
    env = env_of(container)
    assert env["AUTH_TOKEN"] == {"secretKeyRef": {"name": "console-token", "key": "token"}}
    assert env["ETCD_ADDRESS"].startswith("https://")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for variable in ("TLS_CA_FILE", "TLS_CERT_FILE", "TLS_KEY_FILE", "ETCD_CA_FILE",
                     "ETCD_CERT_FILE", "ETCD_KEY_FILE"):
        folder = env[variable].rsplit("/", 1)[0]
        assert folder in mounts, variable
        assert "secret" in volumes[mounts[folder]], variable
    assert volumes["tls"]["secret"]["secretName"] == "rel-gazette-broker-tls"
    # etcd admits it (the release's etcd policy names its own clients only).
    policy = named(objects, "NetworkPolicy", "-console-etcd")
    etcd_pods = named(objects, "StatefulSet", "-etcd")["spec"]["template"]["metadata"][
        "labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= etcd_pods.items()
    [rule] = policy["spec"]["ingress"]
    [source] = rule["from"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert source["podSelector"]["matchLabels"].items() <= labels.items()
    assert rule["ports"] == [{"protocol": "TCP", "port": "client"}]
    assert not [o for o in of_kind(render(helm, None, *ON), "NetworkPolicy")
                if o["metadata"]["name"].startswith("rel-gazette-console")]


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "console.port=0"], "/console/port"),
    (["--set", "console.bogus=1"], "'bogus' not allowed"),
    (["--set", "console.consumerAddress=http://x:1"], "/console/consumerAddress"),
    (["--set", "console.auth.tokenSecret=Not_A_Name"], "/console/auth/tokenSecret"),
    (["--set", "console.timeout=0"], "/console/timeout"),
])
def test_bad_console_values_fail_naming_the_key(helm: Helm, args: list[str], message: str
                                                ) -> None:
    proc = helm("template", "rel", CHART, *ON, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
