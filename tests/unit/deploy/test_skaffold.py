"""skaffold cannot run here: its config is parsed, every path, Dockerfile and target it
names must exist, its profiles must apply, and each Helm release is rendered by a real Helm
with its values files and image templates filled as skaffold fills them."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.fixtures.helm import Helm
from tests.unit.deploy.test_images import parse

ROOT = Path(__file__).resolve().parents[3]
CONFIG = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
DIGEST = "sha256:" + "ab" * 32
TEMPLATE = re.compile(r"{{\.IMAGE_(REPO|TAG|DIGEST)_(\w+)}}")


def artifacts(config: dict[str, Any]) -> list[dict[str, Any]]:
    return list(config["build"]["artifacts"])


def with_profile(name: str) -> dict[str, Any]:
    """The config with profile `name`'s JSON patches applied (the "add" ones we use)."""
    config = copy.deepcopy(CONFIG)
    [profile] = [p for p in config["profiles"] if p["name"] == name]
    for patch in profile["patches"]:
        assert patch["op"] == "add" and patch["path"].endswith("/-"), patch
        *parents, _ = patch["path"].strip("/").split("/")
        target: Any = config
        for part in parents:
            target = target[part]
        target.append(patch["value"])
    return config


def template_var(image: str) -> str:
    """skaffold's name for an artifact in templates: non-alphanumerics become ``_``."""
    return re.sub(r"[^A-Za-z0-9]", "_", image)


def test_every_path_and_target_exists() -> None:
    assert CONFIG["apiVersion"].startswith("skaffold/") and CONFIG["kind"] == "Config"
    everything = artifacts(with_profile("spark"))
    assert {a["image"] for a in everything} == {
        "gazette-broker", "gazette-operator", "gazette-consumer", "gazette-spark"}
    for artifact in everything:
        context = ROOT / artifact.get("context", ".")
        dockerfile = context / artifact["docker"]["dockerfile"]
        assert dockerfile.is_file(), artifact
        assert artifact["docker"]["target"] in {s.name for s in parse(dockerfile)}, artifact
    for release in CONFIG["deploy"]["helm"]["releases"]:
        assert (ROOT / release["chartPath"] / "Chart.yaml").is_file()
        for values in release["valuesFiles"]:
            assert (ROOT / values).is_file(), values


@pytest.mark.parametrize("digest", [DIGEST, ""], ids=["pushed", "local"])
def test_each_release_renders_with_the_built_images(helm: Helm, digest: str) -> None:
    built = {template_var(a["image"]): a["image"] for a in artifacts(CONFIG)}
    for release in CONFIG["deploy"]["helm"]["releases"]:
        sets = []
        for key, template in release["setValueTemplates"].items():
            def fill(match: re.Match[str], key: str = key) -> str:
                kind, name = match.group(1), match.group(2)
                assert name in built, f"{key}: {{{{.IMAGE_{kind}_{name}}}}} is no artifact"
                return {"REPO": f"registry.local/{built[name]}", "TAG": "dev1",
                        "DIGEST": digest}[kind]
            sets += ["--set", f"{key}={TEMPLATE.sub(fill, template)}"]
        args = ["template", release["name"], ROOT / release["chartPath"],
                "--namespace", release["namespace"], *sets]
        for values in release["valuesFiles"]:
            args += ["--values", ROOT / values]
        objects = [d for d in yaml.safe_load_all(helm(*args).stdout) if d]
        images = set()
        for o in objects:
            if o["kind"] in ("Deployment", "StatefulSet"):
                pod = o["spec"]["template"]["spec"]
                images |= {c["image"] for c in [*pod.get("initContainers", []),
                                                *pod["containers"]]}
            if o["apiVersion"].startswith(("apps/", "v1", "policy/", "rbac.")):
                kubernetes_validate.validate(o, kubernetes_validate.latest_version(), strict=True)
        suffix = f"@{digest}" if digest else ""
        assert f"registry.local/gazette-broker:dev1{suffix}" in images
        assert f"registry.local/gazette-operator:dev1{suffix}" in images
        assert not any(i.endswith("@") for i in images)
        # The port forward names a Service the release creates.
        services = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
        for forward in CONFIG.get("portForward", []):
            assert forward["resourceName"] in services
