"""Shared fixtures: real etcd, S3 (moto server) and PostgreSQL, each on a free port.

Async tests run on uvloop, the loop our services run on.
"""

from __future__ import annotations

import os

# Tests spawn processes (gazctl, gazette serve) from a process with live gRPC threads.
# grpcio's fork handlers then run in the child between fork and exec and have crashed it
# (SIGSEGV before exec); the children exec at once and need none of them. Must be set
# before gRPC initialises.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from collections.abc import Callable, Mapping
from typing import Any

import uvloop

pytest_plugins = [
    "tests.fixtures.etcd",
    "tests.fixtures.s3",
    "tests.fixtures.postgres",
    "tests.fixtures.broker",
    "tests.fixtures.consumer",
    "tests.fixtures.fuzz",
    "tests.fixtures.member_wire",
    "tests.fixtures.kube",
    "tests.fixtures.helm",
    "tests.fixtures.spark",
]


#: Whether the session runs the tests of the built images and their background build is
#: still to start (set at collection).
_IMAGES_WANTED = False
#: Tests that measure timing against faults: the background build of the images starts
#: only once they are done (a cold build, run beside them, starved the clusters of the
#: fault suites until their deadlines passed, though it runs at the lowest priority).
_BEFORE_PREBUILD = ("tests/e2e/", "tests/fault/")


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    """Tests that run the built images: build them in the background (see below)."""
    global _IMAGES_WANTED
    _IMAGES_WANTED = any(
        item.nodeid.startswith("tests/integration/deploy/test_chart_processes.py")
        for item in items)


def pytest_runtest_setup(item: Any) -> None:
    """The first test past the fault suites starts the images' background build, so a
    cold build (minutes) overlaps the integration tests that run before the image
    tests; `prebuild` starts it once per session."""
    global _IMAGES_WANTED
    if _IMAGES_WANTED and not item.nodeid.startswith(_BEFORE_PREBUILD):
        _IMAGES_WANTED = False  # started (or podman is missing: `build` says so)
        import tempfile
        from pathlib import Path

        from tests.fixtures.images import prebuild

        prebuild(Path(tempfile.mkdtemp(prefix="gazette-images-")) / "prebuild.log")


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    from tests.fixtures.images import stop_prebuild

    stop_prebuild()


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], Any]]:
    return {"uvloop": uvloop.new_event_loop}
