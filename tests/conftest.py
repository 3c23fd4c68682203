"""Shared fixtures: real etcd, S3 (moto server) and PostgreSQL, each on a free port.

Async tests run on uvloop, the loop our services run on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import uvloop

pytest_plugins = [
    "tests.fixtures.etcd",
    "tests.fixtures.s3",
    "tests.fixtures.postgres",
    "tests.fixtures.broker",
]


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], Any]]:
    return {"uvloop": uvloop.new_event_loop}
