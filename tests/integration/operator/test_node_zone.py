"""`gazette_operator.node_zone`, the broker pods' init container, against an emulated API
server: it writes the node's zone label, falls back to --default, and fails naming the
node, the label or the HTTP status when it cannot."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import kmock
import pytest

from gazette_operator import node_zone
from tests.fixtures.kube import Emulator

pytestmark = pytest.mark.integration


async def add_node(kube: Emulator, name: str, labels: dict[str, str]) -> None:
    kube.resources["v1/nodes"] = kmock.ResourceInfo(
        kind="Node", namespaced=False, verbs={"get", "list", "create"})
    async with aiohttp.ClientSession() as http, http.post(
            f"{str(kube.url).rstrip('/')}/api/v1/nodes",
            json={"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": name, "labels": labels}}) as r:
        assert r.status < 300, await r.text()


async def run(kube: Emulator, tmp_path: Path, *args: str) -> tuple[int, str]:
    out = tmp_path / "zone"
    out.unlink(missing_ok=True)
    token = tmp_path / "sa"
    token.mkdir(exist_ok=True)
    (token / "token").write_text("a-token\n")
    code = await asyncio.to_thread(node_zone.main, [
        "--api", str(kube.url), "--service-account", str(token), "--out", str(out), *args])
    return code, out.read_text() if out.exists() else ""


async def test_the_zone_is_the_node_label(kube: Emulator, tmp_path: Path) -> None:
    await add_node(kube, "node-1", {"topology.kubernetes.io/zone": "eu-west-1b"})
    assert await run(kube, tmp_path, "--node", "node-1") == (0, "eu-west-1b")
    # The service account's token went along as a bearer token.
    [get] = [r for r in kube if r.method == "GET" and r.url.path == "/api/v1/nodes/node-1"]
    assert get.headers["Authorization"] == "Bearer a-token"


async def test_a_node_without_the_label(kube: Emulator, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    await add_node(kube, "bare", {"kubernetes.io/hostname": "bare"})
    assert await run(kube, tmp_path, "--node", "bare", "--default", "zone-x") == (0, "zone-x")
    assert await run(kube, tmp_path, "--node", "bare", "--label", "kubernetes.io/hostname"
                     ) == (0, "bare")
    assert await run(kube, tmp_path, "--node", "bare") == (1, "")
    assert "node 'bare' has no label 'topology.kubernetes.io/zone'" in capsys.readouterr().err


async def test_failures_name_what_is_wrong(kube: Emulator, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    await add_node(kube, "node-1", {})
    assert await run(kube, tmp_path, "--node", "missing") == (1, "")
    assert "/api/v1/nodes/missing: 404" in capsys.readouterr().err
    assert await run(kube, tmp_path, "--node", "") == (1, "")
    assert "no node name" in capsys.readouterr().err
    with pytest.raises(node_zone.ZoneError, match=r"refused"):
        node_zone.node_zone("http://127.0.0.1:1", "node-1")
