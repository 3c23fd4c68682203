"""``python -m gazette_operator`` as the image runs it: a real process that logs in with
kopf's kubeconfig login (the emulated API's URL in a kubeconfig file), peers through a
ClusterKopfPeering as in production, writes a JournalSpec into a real etcd, answers its
liveness and metrics ports, and exits 0 on SIGTERM. ``--help`` documents the
environment and runs nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gazette.keyspace import Etcd
from gazette.local.etcd import EmbeddedEtcd
from tests.fixtures.kube import Emulator
from tests.fixtures.polling import eventually
from tests.fixtures.procs import free_port, log_tail, run_process
from tests.integration.operator.test_operator import create, example, status

pytestmark = pytest.mark.integration

OPERATOR = [sys.executable, "-m", "gazette_operator"]
PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
PEERING_NAME = "gazette-operator"  # the entrypoint's default
POD_ID = "gazette-operator-test-0"  # kopf's peer identity (the pod name in a cluster)
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator",
                                                      "user": "tester"}}],
    }))
    return path


async def serve_peering(kube: Emulator) -> None:
    """The ClusterKopfPeering CRD (as kopf's peering.yaml declares it: cluster-scoped, no
    status subresource) and the peering object a deployment creates beside it."""
    kube.resources[PEERINGS] = kube.ResourceInfo(
        kind="ClusterKopfPeering", namespaced=False,
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"})
    async with aiohttp.ClientSession() as http, http.post(
            f"{str(kube.url).rstrip('/')}/apis/{PEERINGS}",
            json={"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                  "metadata": {"name": PEERING_NAME}}) as r:
        assert r.status < 300, await r.text()


def peers(kube: Emulator) -> dict[str, Any]:
    return dict(kube.objects[PEERINGS, None, PEERING_NAME].raw.get("status") or {})


async def answers(url: str, text: str = "") -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            return r.status == 200 and text in await r.text()
    except aiohttp.ClientError:
        return False


class OperatorProcess:
    """``python -m gazette_operator`` as a subprocess logging into `kube` by kubeconfig."""

    def __init__(self, kube: Emulator, etcd_endpoint: str, prefix: str, folder: Path,
                 pod_id: str, **env: str) -> None:
        assert not SERVICE_ACCOUNT_TOKEN.exists(), (
            "a service account is mounted here: its login would outrank the test's kubeconfig")
        self.pod_id, self.health, self.metrics = pod_id, free_port(), free_port()
        self.log = folder / f"{pod_id}.log"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("KUBE") and k not in ("WATCH_NAMESPACES", "PEERING_NAME")}
        self.env.update(
            KUBECONFIG=str(write_kubeconfig(folder / "kubeconfig", str(kube.url).rstrip("/"))),
            ETCD_ADDRESS=etcd_endpoint, BROKER_ETCD_PREFIX=prefix,
            HEALTH_PORT=str(self.health), METRICS_PORT=str(self.metrics), DRIFT_INTERVAL="1",
            POD_ID=pod_id, LOG_LEVEL="INFO", **env)
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *OPERATOR, env=self.env, stdout=out, stderr=asyncio.subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def logged(self, line: str) -> bool:
        return line in self.text()

    async def until(self, check: Callable[[], Awaitable[bool]], what: str,
                    timeout: float) -> None:
        """`eventually`, failing at once if the operator exits; its log on failure."""
        async def running() -> bool:
            assert self.proc is not None and self.proc.returncode is None, "it exited"
            return await check()
        try:
            await eventually(running, f"{self.pod_id}: {what}", timeout)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{log_tail(self.log)}") from None

    async def stop(self) -> int:
        """SIGTERM, and its exit code within 30 s."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"no exit within 30s of SIGTERM:\n{log_tail(self.log)}") from None
        return self.proc.returncode


async def has_peer(kube: Emulator, pod_id: str) -> bool:
    return pod_id in peers(kube)


async def in_etcd(etcd: Etcd, key: str) -> bool:
    return (await etcd.get(key))[1] is not None


async def test_the_entrypoint_syncs_serves_probes_and_stops_on_sigterm(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str, etcd: Etcd,
        tmp_path: Path) -> None:
    await serve_peering(kube)
    op = OperatorProcess(kube, etcd_server.endpoint, etcd_prefix, tmp_path, POD_ID)
    key = f"{etcd_prefix}/items/example/journal"
    await op.start()
    try:
        await op.until(lambda: answers(f"http://127.0.0.1:{op.health}/healthz"),
                       "the liveness endpoint answers", 20)
        await create(kube, example())
        await op.until(lambda: in_etcd(etcd, key), f"{key} is in etcd", 20)
        # It acted as the peer it announced in the ClusterKopfPeering (the production path).
        assert POD_ID in peers(kube)
        writes = 'gazette_operator_spec_writes_total{kind="journalspecs"} 1.0'
        await op.until(lambda: answers(f"http://127.0.0.1:{op.metrics}/", writes),
                       "the metrics endpoint shows the spec writes", 10)
    finally:
        code = await op.stop()
    assert code == 0, log_tail(op.log)
    assert "Signal SIGTERM is received. Operator is stopping." in op.text()
    # On its way out it withdrew from the peering.
    assert POD_ID not in peers(kube)


async def test_of_two_replicas_one_acts_and_the_other_takes_over(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str, etcd: Etcd,
        tmp_path: Path) -> None:
    """Leader election by peering: replicas get distinct priorities (random by default;
    set here), the lower one pauses, and resumes once the higher one has gone."""
    await serve_peering(kube)
    high = OperatorProcess(kube, etcd_server.endpoint, etcd_prefix, tmp_path, "op-high",
                           PEERING_PRIORITY="200")
    low = OperatorProcess(kube, etcd_server.endpoint, etcd_prefix, tmp_path, "op-low",
                          PEERING_PRIORITY="100")
    await high.start()
    try:
        # kopf starts every replica paused and resumes one when the peering allows it.
        await high.until(lambda: high.logged("Resuming operations"), "the replica acts", 20)
        await low.start()
        await low.until(lambda: has_peer(kube, "op-low"),
                        "the second replica joins the peering", 20)
        await create(kube, example())
        key = f"{etcd_prefix}/items/example/journal"
        await high.until(lambda: in_etcd(etcd, key), f"{key} is in etcd", 20)
        assert "Handler 'sync' succeeded" in high.text()
        # The lower replica saw the higher one from the start: it never acted.
        assert "Resuming operations" not in low.text()
        assert "Handler 'sync'" not in low.text()
        assert await high.stop() == 0
        await low.until(lambda: low.logged("Resuming operations"),
                        "the lower replica resumes", 20)
        second = example(1)
        await create(kube, second)
        key = f"{etcd_prefix}/items/{second['spec']['name']}"
        await low.until(lambda: in_etcd(etcd, key), f"{key} is in etcd", 20)
    finally:
        for op in (high, low):
            if op.proc is not None:
                await op.stop()


async def test_help_documents_the_environment_and_runs_nothing() -> None:
    proc = await asyncio.create_subprocess_exec(
        *OPERATOR, "--help", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    with contextlib.suppress(TimeoutError):
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    if proc.returncode is None:
        proc.kill()
        await proc.wait()
        raise AssertionError("--help did not exit: it ran the operator")
    assert proc.returncode == 0, err.decode()[-2000:]
    text = out.decode()
    for name in ("ETCD_ADDRESS", "BROKER_ETCD_PREFIX", "CONSUMER_ETCD_PREFIX",
                 "DRIFT_INTERVAL", "WATCH_NAMESPACES", "PEERING_NAME", "HEALTH_PORT",
                 "METRICS_PORT", "LOG_LEVEL"):
        assert name in text, name


def bare_env(home: Path, **env: str) -> dict[str, str]:
    """This environment without Kubernetes credentials or operator settings: `home` as
    HOME (so no ~/.kube/config), free health and metrics ports, plus `env`."""
    assert not SERVICE_ACCOUNT_TOKEN.exists(), "a service account is mounted here"
    home.mkdir(parents=True, exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")
            and k not in ("WATCH_NAMESPACES", "PEERING_NAME", "DRIFT_INTERVAL", "LOG_LEVEL")}
    return {**keep, "HOME": str(home), "HEALTH_PORT": str(free_port()),
            "METRICS_PORT": str(free_port()), **env}


def assert_one_clear_line(code: int, err: str, *names: str) -> None:
    """Exit status 1, no traceback, one line on stderr naming each of `names`."""
    assert code == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    for name in names:
        assert name in lines[0], (name, lines[0])


@pytest.mark.parametrize("kubeconfig", ["unset", "missing file"])
async def test_without_kubernetes_credentials_it_exits_with_one_line(
        tmp_path: Path, kubeconfig: str) -> None:
    """Neither a service account nor a kubeconfig: one line naming where it looked and
    what to do, where kopf alone logs about a hundred lines of tracebacks."""
    env = bare_env(tmp_path / "home", ETCD_ADDRESS=f"http://127.0.0.1:{free_port()}")
    looked = [str(SERVICE_ACCOUNT_TOKEN), "set KUBECONFIG"]
    if kubeconfig == "unset":
        looked += ["$KUBECONFIG is unset", str(tmp_path / "home" / ".kube" / "config")]
    else:
        env["KUBECONFIG"] = str(tmp_path / "nowhere" / "kubeconfig")
        looked += [f"$KUBECONFIG={env['KUBECONFIG']}", "No such file or directory"]
    code, _, err = await run_process(OPERATOR, env)
    assert_one_clear_line(code, err, "no Kubernetes credentials", *looked)


async def test_a_malformed_kubeconfig_is_named_in_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "home" / ".kube" / "config"
    kubeconfig.parent.mkdir(parents=True)
    kubeconfig.write_text("clusters: [\n")
    code, _, err = await run_process(OPERATOR, bare_env(tmp_path / "home"))
    assert_one_clear_line(code, err, "~/.kube/config is not a usable kubeconfig",
                          "ParserError")


@pytest.mark.parametrize(("name", "value", "message"), [
    ("DRIFT_INTERVAL", "soon", "DRIFT_INTERVAL='soon' is not a number"),
    ("HEALTH_PORT", "eighty", "HEALTH_PORT='eighty' is not an integer"),
    ("LOG_LEVEL", "loud", "LOG_LEVEL='loud' is not a log level"),
    ("FINALIZER", "no slash", "FINALIZER: 'no slash' is not a qualified name"),
    ("OPERATOR_ETCD_PREFIX", "relative", "OPERATOR_ETCD_PREFIX: "),
    ("HEALTH_PORT", "busy", "cannot listen on HEALTH_PORT={port}: Address already in use"),
    ("METRICS_PORT", "busy",
     "cannot serve metrics on METRICS_PORT={port}: Address already in use"),
])
async def test_a_bad_setting_exits_with_one_line(
        tmp_path: Path, name: str, value: str, message: str) -> None:
    """With credentials at hand (a kubeconfig; the API it names is never reached), a bad
    environment value or a port in use is one line naming it, not a traceback."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{free_port()}")
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = bare_env(tmp_path / "home", KUBECONFIG=str(kubeconfig), PEERING_NAME="",
                       ETCD_ADDRESS=f"http://127.0.0.1:{free_port()}")
        env[name] = str(port) if value == "busy" else value
        code, _, err = await run_process(OPERATOR, env)
    assert_one_clear_line(code, err, message.format(port=port))


async def test_an_unreachable_etcd_does_not_stop_it_starting(
        kube: Emulator, etcd_prefix: str, tmp_path: Path) -> None:
    """etcd is not needed to start: it serves, reports the resource ``Synced=False``
    (EtcdUnavailable) and keeps running, without a traceback in its log."""
    op = OperatorProcess(kube, f"http://127.0.0.1:{free_port()}", etcd_prefix, tmp_path,
                         POD_ID, PEERING_NAME="")
    await op.start()
    try:
        await op.until(lambda: answers(f"http://127.0.0.1:{op.health}/healthz"),
                       "the liveness endpoint answers", 20)
        await create(kube, example())

        async def unsynced() -> bool:
            return any(c["type"] == "Synced" and c.get("reason") == "EtcdUnavailable"
                       for c in status(kube).get("conditions", []))

        await op.until(unsynced, "Synced=False (EtcdUnavailable)", 30)
    finally:
        code = await op.stop()
    assert code == 0, log_tail(op.log)
    assert "Traceback" not in op.text(), log_tail(op.log)
