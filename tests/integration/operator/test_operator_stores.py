"""A JournalSpec whose fragment stores no registered broker serves is not written, and
its status says which scheme and what the brokers serve; it is written once a broker
serving it registers (the drift check looks again). With no broker registered at all it
is written, and the status says that nothing was checked. Real brokers (one serving
only ``s3://``, one with a file root) over a real etcd; Kubernetes emulated."""

from __future__ import annotations

from pathlib import Path

import pytest

from gazette.keyspace import Etcd
from gazette.local.etcd import EmbeddedEtcd
from gazette_broker import BrokerServer
from tests.fixtures.broker import broker_config
from tests.fixtures.kube import Emulator
from tests.fixtures.polling import eventually
from tests.integration.operator.test_operator import (
    condition,
    create,
    running_operator,
    spec_in_etcd,
    status,
)
from tests.integration.operator.test_operator_ownership import journal

pytestmark = pytest.mark.integration


async def test_a_journal_no_broker_can_serve_waits_for_one(
        kube: Emulator, etcd_server: EmbeddedEtcd, etcd_prefix: str, etcd: Etcd,
        tmp_path: Path) -> None:
    brokers: list[BrokerServer] = []
    async with running_operator(kube, etcd_server.endpoint, etcd_prefix):
        try:
            # No broker registered yet: written, and the status says nothing was checked.
            await create(kube, journal("early", 1, "early/journal"))
            await eventually(lambda: status(kube, "early").get("ready") == "True",
                             "written", 20)
            assert "no broker is registered yet" in condition(kube, "Ready", "early")["message"]

            s3_only = BrokerServer(broker_config(etcd_server.endpoint, etcd_prefix,
                                                 tmp_path / "s3", file_root=None))
            await s3_only.start()
            brokers.append(s3_only)
            assert s3_only.store_schemes == ("s3",)
            await create(kube, journal("unserved", 1, "files/journal"))

            def refused() -> bool:
                return condition(kube, "Ready", "unserved").get("reason") == "UnservedStores"

            await eventually(refused, "Ready=False, UnservedStores", 20)
            ready = condition(kube, "Ready", "unserved")
            assert ready["status"] == "False"
            assert "no broker serves file:// stores" in ready["message"], ready
            assert "(the 1 registered broker serves s3://)" in ready["message"], ready
            assert condition(kube, "Synced", "unserved")["status"] == "False"
            assert await spec_in_etcd(etcd, f"{etcd_prefix}/items/files/journal") is None

            files = BrokerServer(broker_config(etcd_server.endpoint, etcd_prefix,
                                               tmp_path / "files"))
            await files.start()
            brokers.append(files)

            async def written() -> bool:
                return await spec_in_etcd(etcd, f"{etcd_prefix}/items/files/journal") \
                    is not None

            await eventually(written, "written once a broker serves file://", 20)
            await eventually(lambda: status(kube, "unserved").get("ready") == "True",
                             "Ready once written", 20)
            assert "no broker" not in condition(kube, "Ready", "unserved")["message"]
        finally:
            for broker in brokers:
                await broker.stop()
