"""The Kubernetes docs' commands, tried here (docs/kubernetes.md, operator.md and
spark-on-kubernetes.md). Every command of their ``console`` blocks is either run, or named
as needing a cluster; a new command that is neither fails, so none goes untried.

Run here: ``make images`` (as ``DRY_RUN=1``: what it would build; the real build runs in
test_chart_processes.py) and its tags against what each documented ``helm install`` of
the same registry pulls; every ``helm install``/``upgrade``/``template`` rendered by a
real Helm (with the values files the docs introduce, and the refusal a doc shows where it
shows one); ``kubectl apply -f`` of local files and of here-documents checked against the
CRDs and our validation; ``gazctl auth issue``; image builds' contexts. The quick start's
cluster steps (apply, append, publish, query) run against the chart run as processes."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gazette_operator import crds
from gazette_operator.sync import declared
from tests.fixtures.doc_commands import Command, commands, yaml_block
from tests.fixtures.helm import Helm

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
DOCS = ["docs/kubernetes.md", "docs/operator.md", "docs/spark-on-kubernetes.md"]
ALL = [c for doc in DOCS for c in commands(doc)]

#: What only a cluster answers: reading a live release, forwarding its ports, execs into
#: pods, secrets and jobs made by hand, S3 listings of a bucket in the cloud.
NEEDS_A_CLUSTER = re.compile(
    r"^(kubectl (-n \S+ )?(get|logs|port-forward|exec|create|delete|wait|describe)\b"
    r"|curl (.* )?http://localhost:|aws |secret\(\) |export AWS_)")
#: Commands that run this test suite's own tests.
THE_SUITE = re.compile(r"^\.venv/bin/python -m pytest ")
HELM_ONLY_IN_A_CLUSTER = {"--create-namespace", "--reset-then-reuse-values",
                          "--reuse-values", "--wait", "--wait-for-jobs", "--atomic"}


def kind_of(command: Command) -> str:
    line = command.line
    if line.startswith("make images"):
        return "make"
    if re.match(r"helm (install|upgrade|template) ", line):
        return "helm"
    if re.match(r"kubectl (-n \S+ )?apply -f ", line):
        return "apply"
    if line.startswith("gazctl auth issue "):
        return "gazctl"
    if re.match(r"(podman|docker) build ", line):
        return "build"
    if THE_SUITE.match(line):
        return "suite"
    if NEEDS_A_CLUSTER.match(line):
        return "cluster"
    return "unknown"


def test_every_command_is_tried_or_needs_a_cluster() -> None:
    unknown = [c.id + ": " + c.line for c in ALL if kind_of(c) == "unknown"]
    assert not unknown, f"commands neither run here nor known to need a cluster: {unknown}"
    assert sum(kind_of(c) not in ("cluster", "suite") for c in ALL) >= 15


def make_images(command: Command) -> list[str]:
    """`make images ...` as a dry run: the references it would build."""
    argv = [*command.argv(), "DRY_RUN=1", f"PYTHON={sys.executable}"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return re.findall(r"^would build (\S+) ", proc.stdout, re.MULTILINE)


def helm_argv(command: Command, tmp_path: Path) -> list[str]:
    """The command as `helm template` (what a cluster alone does dropped), with the values
    files a doc introduces written where it names them."""
    words = command.argv()[1:]
    verb, release, chart, *rest = words
    args = ["template", release, str(ROOT / chart)]
    if verb == "upgrade" and HELM_ONLY_IN_A_CLUSTER & {"--reset-then-reuse-values",
                                                       "--reuse-values"} & set(rest):
        # The release's earlier values are reused: those of the doc's install before it.
        [*_, install] = [c for c in commands(command.doc)[:command.index]
                         if c.line.startswith(f"helm install {release} ")]
        rest = [*install.argv()[4:], *rest]
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in HELM_ONLY_IN_A_CLUSTER:
            pass
        elif word in ("--values", "-f") and not (ROOT / rest[i + 1]).exists():
            values = tmp_path / rest[i + 1]
            values.write_text(yaml_block(command.doc, rest[i + 1]))
            args += [word, str(values)]
            i += 1
        elif word in ("--values", "-f"):
            args += [word, str(ROOT / rest[i + 1])]
            i += 1
        else:
            args.append(word)
        i += 1
    return args


@pytest.mark.parametrize("command", [c for c in ALL if kind_of(c) == "helm"],
                         ids=lambda c: c.id)
def test_helm_commands_render(command: Command, helm: Helm, tmp_path: Path) -> None:
    proc = helm(*helm_argv(command, tmp_path), check=False)
    if command.output.startswith("Error:"):
        # The doc shows a refusal: Helm refuses it, saying what the doc says.
        assert proc.returncode != 0
        for line in command.output.splitlines()[1:]:
            assert line.strip("- ") in proc.stderr, (line, proc.stderr)
        return
    assert proc.returncode == 0, proc.stderr
    objects = [o for o in yaml.safe_load_all(proc.stdout) if o]
    assert any(o["kind"] == "Deployment" for o in objects)
    # What it pulls of ours is what the doc's `make images` of the same registry builds.
    effective = " ".join(helm_argv(command, tmp_path))
    registry = re.search(r"image\.registry=(\S+)", effective)
    builds = [c for c in commands(command.doc) if kind_of(c) == "make" and (
        f"REGISTRY={registry.group(1)}" in c.line if registry else c.line == "make images")]
    if builds and "image.tag" not in effective:
        built = set(make_images(builds[0]))
        pulled = {c["image"] for o in objects for c in containers(o)
                  if re.search(r"(^|/)gazette-(broker|operator|consumer|spark):", c["image"])}
        assert pulled and pulled <= built, (pulled, built)


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    spec = spec.get("jobTemplate", {}).get("spec", spec)
    pod = spec.get("template", {}).get("spec", {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


@pytest.mark.parametrize("command", [c for c in ALL if kind_of(c) == "make"],
                         ids=lambda c: c.id)
def test_make_images_builds_the_documented_tags(command: Command) -> None:
    refs = make_images(command)
    assert refs, command.line
    registry = re.search(r"REGISTRY=(\S+)", command.line)
    tag = re.search(r"TAG=(\S+)", command.line)
    for ref in refs:
        assert ref.startswith(f"{registry.group(1)}/gazette-" if registry else "gazette-")
        assert ref.endswith(f":{tag.group(1) if tag else '0.1.0'}")


def check_resource(obj: dict[str, Any]) -> None:
    schemas = {c["spec"]["names"]["kind"]: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
               for c in (crds.journal_crd(), crds.shard_crd())}
    if obj["kind"] in schemas:
        jsonschema.validate(obj, schemas[obj["kind"]])
        declared(obj["kind"], obj["spec"])  # our validation: raises naming the field
    else:
        assert obj["apiVersion"] in ("apiextensions.k8s.io/v1", "kopf.dev/v1"), obj["kind"]


@pytest.mark.parametrize("command", [c for c in ALL if kind_of(c) == "apply"],
                         ids=lambda c: c.id)
def test_kubectl_apply_takes_valid_resources(command: Command) -> None:
    argv = command.argv()
    source = argv[argv.index("-f") + 1]
    if source == "-":
        documents = list(yaml.safe_load_all(command.heredoc))
    else:
        path = ROOT / source
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        assert files, f"{source}: nothing to apply"
        documents = [d for f in files for d in yaml.safe_load_all(f.read_text())]
    documents = [d for d in documents if d]
    assert documents
    for obj in documents:
        check_resource(obj)


@pytest.mark.parametrize("command", [c for c in ALL if kind_of(c) == "gazctl"],
                         ids=lambda c: c.id)
def test_gazctl_commands_run(command: Command, tmp_path: Path) -> None:
    # The keys file the doc's Secret holds: 32 random bytes, base64.
    (tmp_path / "keys").write_text(base64.b64encode(os.urandom(32)).decode())
    gazctl = Path(sys.executable).parent / "gazctl"
    proc = subprocess.run([str(gazctl), *command.argv()[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), "no token printed"


@pytest.mark.parametrize("command", [c for c in ALL if kind_of(c) == "build"],
                         ids=lambda c: c.id)
def test_image_builds_name_a_context_and_the_chart_tags(command: Command) -> None:
    argv = command.argv()
    context = ROOT / argv[-1]
    assert (context / "Dockerfile").is_file(), f"{argv[-1]} has no Dockerfile"
    for i, word in enumerate(argv):
        if word == "--target":
            stages = re.findall(r"^FROM \S+ AS (\S+)", (context / "Dockerfile").read_text(),
                                re.MULTILINE)
            assert argv[i + 1] in stages, (argv[i + 1], stages)
        if word == "--build-arg" and argv[i + 1].startswith("BASE="):
            base = argv[i + 1].split("=", 1)[1]
            assert re.fullmatch(r"(\S+/)?gazette-consumer:0\.1\.0", base), base
