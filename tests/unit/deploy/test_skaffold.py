"""skaffold cannot run here: its config is parsed, and every path and Dockerfile it names
must exist."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def test_every_path_skaffold_names_exists() -> None:
    config = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
    assert config["apiVersion"].startswith("skaffold/") and config["kind"] == "Config"
    artifacts = config["build"]["artifacts"]
    assert {a["image"] for a in artifacts} >= {"gazette-broker", "gazette-operator"}
    for artifact in artifacts:
        context = ROOT / artifact.get("context", ".")
        assert context.is_dir()
        assert (context / artifact["docker"]["dockerfile"]).is_file(), artifact
    for manifest in config.get("manifests", {}).get("rawYaml", []):
        assert (ROOT / manifest).is_file(), manifest
