"""The servers `peers.py` compares, started on free loopback ports with their data and
logs in the run's folder, each awaited until it answers (or refused with the tail of its
log) and stopped on the way out: ``python -m gazette_broker serve`` on the caller's etcd,
``nats-server -js`` (file storage) and ``redis-server`` (AOF fsynced every second, no
RDB snapshots)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aioredis
from peer_targets import BINARIES, START_TIMEOUT  # type: ignore[import-not-found]

from gazette.client import JournalClient
from gazette.local import free_port, log_tail

STOP_TIMEOUT = 60.0
#: Our broker's data path (``--broker.data-port``), which our client then takes for
#: the appends that fit a frame; ``DATA_PATH=0``: gRPC only.
DATA_PATH_ARGS = ("--broker.data-port", "0") if os.environ.get("DATA_PATH", "1") != "0" \
    else ()


def server_cpu_s(pid: int) -> float:
    """CPU seconds of process `pid` and of its children it waited for (Redis' AOF
    rewrites), from /proc/<pid>/stat (utime, stime, cutime, cstime)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def version(system: str) -> str:
    """The server's version, from `--version`."""
    out = subprocess.run([BINARIES[system], "--version"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    match = re.search(r"v=?(\d[\w.\-]*)", out)
    return match.group(1) if match else out.strip()


@dataclass(frozen=True, slots=True)
class Server:
    """A running server: its address (for clients) and process id (for its CPU)."""

    address: str
    pid: int


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `STOP_TIMEOUT` s."""
    if proc.returncode is None:
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def _await_start(name: str, proc: asyncio.subprocess.Process, log: Path,
                       probe: Any) -> None:
    """Until `probe()` succeeds; raises naming the server, with its log's tail, if it
    exits first or `START_TIMEOUT` passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            await asyncio.wait_for(probe(), 5)
            return
        except Exception as exc:  # still starting
            if proc.returncode is not None or time.monotonic() > deadline:
                why = (f"exited with {proc.returncode}" if proc.returncode is not None
                       else f"did not answer within {START_TIMEOUT:.0f} s")
                raise RuntimeError(f"{name} did not start ({why}; last error {exc!r}); "
                                   f"the tail of {log}:\n{log_tail(log)}") from exc
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def serve(system: str, workdir: Path, etcd_endpoint: str | None,
                tunables: str) -> AsyncIterator[Server]:
    """`system`'s server on a free loopback port, with its data and log under `workdir`;
    stopped on the way out."""
    port = free_port()
    log = workdir / f"{system}-server.log"
    if system == "ours":
        assert etcd_endpoint is not None
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gazette_broker", "serve", "--broker.port", str(port),
                "--broker.http-port", "-1", "--broker.host", "127.0.0.1",
                "--broker.file-root", str(workdir / "store"), "--broker.spool-dir",
                str(workdir / "spools"), "--etcd.address", etcd_endpoint, "--log.level",
                "warn", *DATA_PATH_ARGS, stdout=out, stderr=subprocess.STDOUT,
                env=dict(os.environ, GLIBC_TUNABLES=tunables))
        finally:
            os.close(out)
        address = f"127.0.0.1:{port}"

        async def probe() -> None:
            async with JournalClient(address, timeout=2) as client:
                await client.list("prefix=peers/")
    elif system == "nats":
        proc = await asyncio.create_subprocess_exec(
            "nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd",
            str(workdir / "jetstream"), "-l", str(log))
        address = f"nats://127.0.0.1:{port}"

        async def probe() -> None:
            nc = await nats.connect(address, allow_reconnect=False, connect_timeout=1,
                                    error_cb=_quiet)
            try:
                await nc.jetstream().account_info()
            finally:
                await nc.close()
    elif system == "redis":
        (workdir / "redis").mkdir(exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--appendonly",
            "yes", "--appendfsync", "everysec", "--save", "", "--dir",
            str(workdir / "redis"), "--logfile", str(log))
        address = f"127.0.0.1:{port}"

        async def probe() -> None:
            r = aioredis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
            try:
                await r.ping()
            finally:
                await r.aclose()
    else:
        raise ValueError(f"unknown system {system!r}")
    try:
        await _await_start(BINARIES.get(system, "the gazette broker"), proc, log, probe)
        yield Server(address, proc.pid)
    finally:
        await _stop(proc)


async def _quiet(exc: Exception) -> None:
    """nats-py reports connection errors; while the server starts they are expected."""
