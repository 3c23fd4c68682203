"""The local cluster demo (`make demo`): real etcd, tutorial journals, state shown."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest

from gazette.keyspace import Etcd, KeySpace, Layout
from gazette.keyspace.specs import Decoder
from gazette.local.demo import run_demo
from gazette.local.tutorial import TUTORIAL_SELECTIONS
from gazette.protocol import CompressionCodec, JournalSpec
from tests.fixtures.etcd import EtcdServer

pytestmark = pytest.mark.integration


async def test_demo_applies_the_tutorial_journals(etcd_server: EtcdServer,
                                                  etcd_prefix: str) -> None:
    layout = Layout(etcd_prefix)
    out = io.StringIO()
    await run_demo(etcd_server.endpoint, out, layout)
    text = out.getvalue()
    assert "Applied 4 journal specs" in text
    for selector, selected in TUTORIAL_SELECTIONS:
        assert re.search(rf"-l {re.escape(repr(selector))}\s+-> {re.escape(', '.join(selected))}\n",
                         text), selector
    assert "at its old revision is refused" in text

    async with Etcd(etcd_server.endpoint) as etcd:
        ks: KeySpace[object] = KeySpace(etcd, layout.root + "/", Decoder(layout))
        await ks.load()
        specs = {e.value.name: e.value for e in ks.prefixed(layout.items)
                 if isinstance(e.value, JournalSpec)}
    assert sorted(specs) == ["example/journal", "foobar/part-000", "foobar/part-001",
                             "foobar/part-002"]
    part = specs["foobar/part-001"]
    assert part.fragment.length == 4096 and part.fragment.compression_codec is \
        CompressionCodec.GZIP
    assert part.labels.values("my-label") == ("",)

    # Running it again against the same cluster updates in place.
    await run_demo(etcd_server.endpoint, io.StringIO(), layout)


def test_demo_command_runs_and_stops_its_etcd() -> None:
    proc = subprocess.run([sys.executable, "-m", "gazette.local"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Applied 4 journal specs" in proc.stdout
    assert "Stopping etcd." in proc.stdout
    match = re.search(r"etcd [\d.]+ at http://127\.0\.0\.1:\d+ \(pid (\d+)", proc.stdout)
    assert match, proc.stdout
    with pytest.raises(ProcessLookupError):
        os.kill(int(match.group(1)), 0)
