"""The broker core: specs applied in etcd become replicas that serve appends and reads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gazette.fragment import decompress
from gazette.keyspace import Etcd, KeySpace, Layout
from gazette.keyspace.specs import Decoder, apply_changes
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML
from gazette.protocol.trees import SpecChange, journal_changes_from_yaml
from gazette_broker.broker import Broker

pytestmark = pytest.mark.integration


async def eventually(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.02)


async def one(data: bytes) -> Any:
    yield data


async def test_specs_become_replicas_and_content_persists(
    etcd: Etcd, etcd_prefix: str, tmp_path: Path
) -> None:
    layout = Layout(etcd_prefix)
    keyspace: KeySpace[Any] = KeySpace(etcd, layout.root + "/", Decoder(layout))
    async with keyspace:
        broker = Broker(keyspace, layout, tmp_path / "spools", file_root=tmp_path / "root")
        await broker.start()
        try:
            changes = journal_changes_from_yaml(TUTORIAL_JOURNALS_YAML)
            rev = await apply_changes(etcd, layout, changes)
            await keyspace.wait_for_revision(rev, timeout=10)
            await eventually(lambda: len(broker.replicas) == 4, "replicas for 4 journals")

            replica = broker.replicas["example/journal"]
            await replica.append(one(b'{"Msg": "Hello, Gazette!"}\n'))
            assert b"".join([c.content async for c in replica.read(0)]) == (
                b'{"Msg": "Hello, Gazette!"}\n')

            # Deleting a spec stops its replica and persists what it held.
            entry = keyspace.get(layout.item_key("foobar/part-002"))
            assert entry is not None
            part = broker.replicas["foobar/part-002"]
            await part.append(one(b"last words\n"))
            rev = await apply_changes(etcd, layout, [SpecChange(
                "foobar/part-002", entry.mod_revision, None)])
            await keyspace.wait_for_revision(rev, timeout=10)
            await eventually(lambda: "foobar/part-002" not in broker.replicas, "stopped")
            await asyncio.wait_for(broker.wait_closed(), 10)
            await asyncio.wait_for(broker.persister.wait_idle(), 10)
            stored = list((tmp_path / "root").rglob("foobar/part-002/*.gz"))
            assert [decompress(part.spec.fragment.compression_codec, p.read_bytes())
                    for p in stored] == [b"last words\n"]
        finally:
            await broker.close()
        # Closing rolled and persisted the open spools too.
        assert list((tmp_path / "root").rglob("example/journal/*.sz"))
