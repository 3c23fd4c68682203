"""The events example service (examples/orders_service.py) runs as its docs say:
orders placed in transactions, totals kept exactly once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gazette_broker import BrokerServer
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.postgres import PgDatabase

pytestmark = pytest.mark.integration
EXAMPLE = (Path(__file__).parents[3] / "services/consumer/gazette_consumer/examples"
           / "orders_service.py")


async def test_the_orders_service_example_counts_each_order_once(
        broker_server: BrokerServer, etcd_server: EtcdServer, pg_database: PgDatabase) -> None:
    env = dict(os.environ, BROKER_ADDRESS=broker_server.grpc_address,
               ETCD_ADDRESS=etcd_server.endpoint, ORDERS_DSN=pg_database.dsn)
    # In a thread: the broker serves from this process's event loop meanwhile.
    proc = await asyncio.to_thread(subprocess.run, [sys.executable, str(EXAMPLE)], env=env,
                                   capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == \
        "[('c0', 400), ('c1', 300), ('c2', 300)]"
