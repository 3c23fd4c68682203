"""The application author's face: every name `gazette` exports is the one its package
holds, loaded on first use (``import gazette`` loads neither gRPC nor the consumer)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import gazette


@pytest.mark.parametrize("name", gazette.__all__)
def test_each_name_of_the_face_is_its_packages_own(name: str) -> None:
    package = gazette._FACE.get(name, "gazette.errors")
    assert getattr(gazette, name) is getattr(importlib.import_module(package), name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'ShardRunner'"):
        _ = gazette.ShardRunner  # type: ignore[attr-defined]  # machinery: not the face


def test_importing_gazette_loads_nothing_heavy() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, gazette; "
         "print(sorted(m for m in ('grpc', 'gazette.consumer', 'gazette.client', "
         "'aiohttp') if m in sys.modules))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
