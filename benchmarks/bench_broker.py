"""What benchmarks share: one `gazette-broker serve` process on a free loopback port
(journals in a `file:///` store under the work folder), its journals applied, and a
client once the broker serves them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from gazette.client import JournalClient
from gazette.keyspace import Etcd, Layout, apply_changes
from gazette.local import free_port
from gazette.protocol import journal_changes_from_yaml

#: The malloc settings the Makefile and the container image give every process: large
#: buffers (gRPC messages, recorded commits) reuse the heap instead of fresh pages
#: from the kernel at each allocation.
TUNABLES = "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824"


def with_tunables() -> None:
    """Run this script again with `TUNABLES` unless it has them (a benchmark's own
    process, which its clients and SQLite share, measured as deployed)."""
    if os.environ.get("GLIBC_TUNABLES") != TUNABLES:
        print(f"running again with GLIBC_TUNABLES={TUNABLES}", file=sys.stderr, flush=True)
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  dict(os.environ, GLIBC_TUNABLES=TUNABLES))


@contextlib.asynccontextmanager
async def serving_broker(etcd_endpoint: str, workdir: Path, specs: str,
                         journals: Sequence[str], extra: Sequence[str] = ()
                         ) -> AsyncIterator[JournalClient]:
    """A broker with `specs` applied (and the options `extra`); yields a client once it
    serves every one of `journals` (30 s at most); stops the broker on the way out."""
    port = free_port()
    broker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette_broker", "serve", "--broker.port", str(port),
        "--broker.http-port", "-1", "--broker.host", "127.0.0.1", "--broker.file-root",
        str(workdir / "store"), "--broker.spool-dir", str(workdir / "spools"),
        "--etcd.address", etcd_endpoint, "--log.level", "warn", *extra,
        env=dict(os.environ, GLIBC_TUNABLES=TUNABLES))
    try:
        async with Etcd(etcd_endpoint) as etcd:
            await apply_changes(etcd, Layout.brokers(), journal_changes_from_yaml(specs))
        async with JournalClient(f"127.0.0.1:{port}") as client:
            deadline = time.monotonic() + 30
            while True:  # until the broker serves every journal
                try:
                    for journal in journals:
                        await client.write_head(journal)
                    break
                except Exception:  # noqa: BLE001 - the broker is still starting
                    assert time.monotonic() < deadline, "the broker did not start"
                    await asyncio.sleep(0.1)
            yield client
    finally:
        broker.terminate()
        await broker.wait()
