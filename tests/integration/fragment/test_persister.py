"""The persister loses nothing through a store outage."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from gazette.fragment import Fragment, Sha1Verifier, decompress
from gazette.fragment.persister import Persister
from gazette.fragment.spool import Spool
from gazette.fragment.store import S3Store
from gazette.protocol import CompressionCodec
from tests.fixtures.s3 import S3Server

pytestmark = pytest.mark.integration


async def test_fragments_persist_after_an_s3_outage(
    s3_server_restartable: S3Server, tmp_path: Path
) -> None:
    bucket = s3_server_restartable.new_bucket()
    url = (f"s3://{bucket.name}/?endpoint={s3_server_restartable.endpoint_url}"
           "&region=us-east-1")
    store = S3Store(url, env=s3_server_restartable.env(), connect_timeout=1, read_timeout=1,
                    max_attempts=1, op_timeout=1)
    persisted: list[Fragment] = []
    persister = Persister(on_persisted=persisted.append, retry_initial=0.05, retry_max=0.2)
    task = asyncio.create_task(persister.run())
    contents, closed = [], []
    try:
        s3_server_restartable.pause()  # the store is down while fragments close
        begin = 0
        for i in range(3):
            spool = Spool("events/a", begin, tmp_path, CompressionCodec.SNAPPY)
            data = b"".join(b'{"i": %d, "n": %d}\n' % (i, n) for n in range(500))
            spool.write(data)
            spool.commit()
            closed.append(spool.close())
            contents.append(data)
            persister.enqueue(closed[-1], store)
            begin += len(data)
        # Wait until uploads have failed (and been retried) at least twice.
        labels = {"store": url}
        failures = REGISTRY.get_sample_value("gazette_fragment_persist_failures_total",
                                             labels) or 0
        deadline = time.monotonic() + 30
        while (REGISTRY.get_sample_value("gazette_fragment_persist_failures_total", labels)
               or 0) < failures + 2:
            assert time.monotonic() < deadline, "uploads never failed during the outage"
            await asyncio.sleep(0.05)
        assert persisted == [] and all(c.path.exists() for c in closed)  # kept locally
        s3_server_restartable.resume()
        await asyncio.wait_for(persister.wait_idle(), 60)

        assert sorted(f.begin for f in persisted) == [c.fragment.begin for c in closed]
        assert all(f.backing_store == url for f in persisted)
        assert not any(c.path.exists() for c in closed)  # local copies released
        listed = sorted(await store.list("events/a"))
        assert [(f.begin, f.end, f.sha1) for f in listed] == [
            (c.fragment.begin, c.fragment.end, c.fragment.sha1) for c in closed]
        for frag, data in zip(listed, contents, strict=True):
            stored = b"".join([chunk async for chunk in store.get(frag)])
            content = decompress(frag.codec, stored)
            assert content == data
            check = Sha1Verifier(frag)
            check.update(content)
            check.verify()
    finally:
        task.cancel()
        await store.close()


@pytest.mark.parametrize("codec", list(CompressionCodec))
async def test_large_fragments_are_compressed_a_block_at_a_time(
    codec: CompressionCodec, tmp_path: Path
) -> None:
    from gazette.fragment.persister import COMPRESS_BLOCK
    from gazette.fragment.store import FileStore

    store = FileStore("file:///", file_root=tmp_path / "store")
    persisted: list[Fragment] = []
    persister = Persister(on_persisted=persisted.append)
    task = asyncio.create_task(persister.run())
    try:
        spool = Spool("big/one", 0, tmp_path, codec)
        data = b"".join(b'{"n": %d, "pad": "%s"}\n' % (n, b"x" * (n % 97))
                        for n in range(2 * COMPRESS_BLOCK // 60))  # several blocks
        assert len(data) > 2 * COMPRESS_BLOCK
        spool.write(data)
        spool.commit()
        closed = spool.close()
        persister.enqueue(closed, store)
        await asyncio.wait_for(persister.wait_idle(), 60)
    finally:
        task.cancel()
    assert [f.end for f in persisted] == [len(data)]
    _check_stored(tmp_path, closed.fragment, data)


def _check_stored(root: Path, fragment: Fragment, data: bytes) -> None:
    (stored,) = (root / "store" / "big" / "one").iterdir()
    assert stored.name == fragment.content_name
    assert decompress(fragment.codec, stored.read_bytes()) == data
    assert list(root.glob("spool-*")) == []  # the spool and its compressed copy: gone


async def test_peer_copies_upload_later_and_only_if_missing(tmp_path: Path) -> None:
    from gazette.fragment.store import store_for

    store = store_for("file:///", file_root=tmp_path / "store")
    persisted: list[Fragment] = []
    persister = Persister(on_persisted=persisted.append)
    task = asyncio.create_task(persister.run())

    def closed_spool(folder: str, data: bytes) -> object:
        (tmp_path / folder).mkdir(exist_ok=True)
        spool = Spool("peers/a", 0, tmp_path / folder)
        spool.write(data)
        spool.commit()
        return spool.close()

    try:
        primary, peer = closed_spool("primary", b"same\n"), closed_spool("peer", b"same\n")
        lonely = Spool("peers/b", 0, tmp_path / "peer")
        lonely.write(b"only the peer has it\n")
        lonely.commit()
        orphan = lonely.close()
        persister.enqueue(peer, store, if_missing_after=0.3)  # type: ignore[arg-type]
        persister.enqueue(orphan, store, if_missing_after=0.3)
        persister.enqueue(primary, store)  # type: ignore[arg-type]
        await asyncio.wait_for(persister.wait_idle(), 10)
        uploads = REGISTRY.get_sample_value("gazette_fragments_already_stored_total")
        # The primary's upload came first; the peer's copy was found stored, not sent.
        assert [f.journal for f in persisted] == ["peers/a", "peers/a", "peers/b"]
        assert uploads is not None and uploads >= 1
        # The copy only a peer held was uploaded when its time came.
        assert [f.journal for f in await store.list("peers/b")] == ["peers/b"]
        assert not any(p.path.exists() for p in (peer, orphan))  # type: ignore[attr-defined]
    finally:
        task.cancel()


async def test_a_failing_store_delays_only_its_own_fragments(tmp_path: Path) -> None:
    """One store failing (a file where its folder should be) does not hold up uploads to
    another; its health says why; once it heals, its fragments go too (the bug: uploads
    went one at a time, and the failing one was retried for ever first)."""
    from gazette.fragment.store import store_for

    root = tmp_path / "root"
    root.mkdir()
    (root / "broken").write_text("a file where the store's folder should be\n")
    broken = store_for("file:///broken/", file_root=root)
    healthy = store_for("file:///healthy/", file_root=root)
    persisted: list[Fragment] = []
    persister = Persister(on_persisted=persisted.append, retry_initial=0.05, retry_max=0.2)
    task = asyncio.create_task(persister.run())

    def closed(journal: str, n: int) -> object:
        spool = Spool(journal, 0, tmp_path)
        spool.write(b"record %d\n" % n)
        spool.commit()
        return spool.close()

    try:
        stuck = [closed(f"stuck/{n}", n) for n in range(6)]  # more than the upload slots
        for c in stuck:
            persister.enqueue(c, broken)  # type: ignore[arg-type]
        flowing = [closed(f"flowing/{n}", n) for n in range(3)]
        for c in flowing:
            persister.enqueue(c, healthy)  # type: ignore[arg-type]
        deadline = time.monotonic() + 20
        while {f.journal for f in persisted} != {f"flowing/{n}" for n in range(3)}:
            assert time.monotonic() < deadline, f"healthy uploads held up: {persisted}"
            await asyncio.sleep(0.02)
        health = persister.health("file:///broken/")
        assert health.failing and health.pending == 6 and "broken" in health.last_error
        frag = stuck[0].fragment  # type: ignore[attr-defined]
        assert "NotADirectoryError" in persister.error_of(frag) and frag.journal in \
            persister.error_of(frag)
        assert not persister.health("file:///healthy/").failing
        assert REGISTRY.get_sample_value("gazette_store_failing",
                                         {"store": "file:///broken/"}) == 1
        (root / "broken").unlink()  # healed
        await asyncio.wait_for(persister.wait_idle(), 20)
        assert len(persisted) == 9 and not persister.health("file:///broken/").failing
    finally:
        task.cancel()


async def test_a_store_over_its_byte_budget_has_no_room_until_it_drains(
    tmp_path: Path,
) -> None:
    from gazette.fragment.store import store_for

    root = tmp_path / "root"
    root.mkdir()
    (root / "broken").write_text("not a folder\n")
    store = store_for("file:///broken/", file_root=root)
    persister = Persister(retry_initial=0.05, retry_max=0.1, max_pending_bytes=100)
    task = asyncio.create_task(persister.run())
    try:
        spool = Spool("budget/a", 0, tmp_path)
        spool.write(b"x" * 150)
        spool.commit()
        persister.enqueue(spool.close(), store)
        assert not persister.has_room("file:///broken/")
        assert persister.has_room("file:///other/")
        assert not await persister.wait_for_room("file:///broken/", 0.2)
        (root / "broken").unlink()
        assert await persister.wait_for_room("file:///broken/", 20)
    finally:
        task.cancel()
