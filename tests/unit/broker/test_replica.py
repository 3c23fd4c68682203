"""A journal replica: atomic, never-interleaved appends; refusals leave nothing."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment, Persister, decompress
from gazette.fragment.store import store_for
from gazette.labels import LabelSet, Selector
from gazette.protocol import CompressionCodec, FragmentSpec, JournalFlags, JournalSpec
from gazette_broker.errors import AppendError
from gazette_broker.reads import GAPS_SKIPPED, ReadError
from gazette_broker.replica import Replica, Shared

SPEC = JournalSpec("example/journal", replication=1,
                   fragment=FragmentSpec(length=4096, compression_codec=CompressionCodec.NONE,
                                         stores=("file:///store/",)))


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        await asyncio.sleep(0)  # let other appends run in between chunks
        yield p


def replica(tmp_path: Path, spec: JournalSpec = SPEC, **kw: object) -> Replica:
    return Replica(spec, tmp_path, Shared(**kw))  # type: ignore[arg-type]


async def test_appends_commit_in_order_with_their_sha1(tmp_path: Path) -> None:
    r = replica(tmp_path)
    first = await r.append(chunks(b'{"Msg": "Hello, Gazette!"}\n'))
    second = await r.append(chunks(b'{"Msg": "See you', b' later alligator"}\n'))
    assert (first.commit.begin, first.commit.end) == (0, 27)
    assert (second.commit.begin, second.commit.end) == (27, 62)
    assert second.commit.sha1 == hashlib.sha1(b'{"Msg": "See you later alligator"}\n').digest()
    assert r.spool.read(16, 100).startswith(b'Gazette!"}\n{"Msg"')  # the tutorial's offset 16


async def test_twenty_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    r = replica(tmp_path)
    lines = [json.dumps({"Msg": "Race!", "N": i}).encode() + b"\n" for i in range(20)]
    await asyncio.gather(*(r.append(chunks(line[:5], line[5:12], line[12:]))
                           for line in lines))
    content = r.spool.read(0, 1 << 20).splitlines(keepends=True)
    assert sorted(content) == sorted(lines)  # each append whole, none mixed


async def test_a_client_that_goes_away_leaves_nothing(tmp_path: Path) -> None:
    r = replica(tmp_path)
    await r.append(chunks(b"kept\n"))

    async def broken() -> AsyncIterator[bytes]:
        yield b"half of an ap"
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await r.append(broken())
    after = await r.append(chunks(b"next\n"))
    assert after.commit.begin == 5 and r.spool.read(0, 100) == b"kept\nnext\n"


async def test_refusals_write_nothing(tmp_path: Path) -> None:
    r = replica(tmp_path, max_append_size=10)
    await r.append(chunks(b"abc"))
    with pytest.raises(AppendError, match="WRONG_APPEND_OFFSET"):
        await r.append(chunks(b"x"), offset=0)
    assert (await r.append(chunks(b"d"), offset=3)).commit.begin == 3
    with pytest.raises(AppendError, match="APPEND_TOO_LARGE: append is larger"):
        await r.append(chunks(b"123456", b"789012"))
    assert r.write_head == 4 and r.spool.read(0, 100) == b"abcd"
    ro = replica(tmp_path / "ro", replace(SPEC, flags=JournalFlags.O_RDONLY))
    with pytest.raises(AppendError, match="NOT_ALLOWED"):
        await ro.append(chunks(b"x"))


async def test_registers_fence_writers(tmp_path: Path) -> None:
    r = replica(tmp_path)
    owner = LabelSet([("author", "shard-a")])
    res = await r.append(chunks(b"1"), union_registers=owner)
    assert res.registers == owner
    # A writer that expects to own the journal checks the register first.
    with pytest.raises(AppendError, match="REGISTER_MISMATCH"):
        await r.append(chunks(b"2"), check_registers=Selector.parse("author=shard-b"))
    res = await r.append(chunks(b"3"), check_registers=Selector.parse("author=shard-a"),
                         subtract_registers=owner,
                         union_registers=LabelSet([("author", "shard-b")]))
    assert res.registers.values("author") == ("shard-b",)
    assert r.spool.read(0, 10) == b"13"


async def test_spools_roll_whole_appends_into_persisted_fragments(tmp_path: Path) -> None:
    root = tmp_path / "root"
    stores = {}

    def store(url: str):  # type: ignore[no-untyped-def]
        return stores.setdefault(url, store_for(url, file_root=root))

    persister = Persister()
    task = asyncio.create_task(persister.run())
    try:
        (tmp_path / "spools").mkdir()
        r = Replica(SPEC, tmp_path / "spools", Shared(persister, store))
        appends = [(b"%04d" % i) * 250 + b"\n" for i in range(10)]  # 1001 bytes each
        for a in appends:
            await r.append(chunks(a))
        await r.roll()
        await asyncio.wait_for(persister.wait_idle(), 30)
        listed = sorted(await store("file:///store/").list(SPEC.name))
        assert [(f.begin, f.end) for f in listed] == [(0, 5005), (5005, 10010)]
        content = b"".join([decompress(f.codec, (root / "store" / f.path).read_bytes())
                            for f in listed])
        assert content == b"".join(appends)  # whole appends, nothing lost or split
        assert all(f.backing_store for f in r.index.fragments())
    finally:
        task.cancel()


async def test_reads_from_the_spool_like_the_tutorials_gets(tmp_path: Path) -> None:
    r = replica(tmp_path)
    await r.append(chunks(b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'))
    got = [c async for c in r.read(16)]
    assert b"".join(c.content for c in got) == b'Gazette!"}\n{"Msg": "See you later alligator"}\n'
    assert got[0].offset == 16 and got[-1].write_head == 62
    assert [c.content async for c in r.read(0, end_offset=5)] == [b'{"Msg']
    with pytest.raises(ReadError, match="OFFSET_NOT_YET_AVAILABLE"):
        async for _ in r.read(-1):
            pass
    with pytest.raises(ValidationError, match="offset: must be -1 or >= 0"):
        async for _ in r.read(-7):
            pass


async def test_a_blocking_read_sees_later_appends(tmp_path: Path) -> None:
    r = replica(tmp_path)
    await r.append(chunks(b"old\n"))
    seen: list[bytes] = []

    async def follow() -> None:
        async for c in r.read(-1, block=True):
            seen.append(c.content)
            if b"".join(seen).count(b"\n") == 2:
                return

    reader = asyncio.create_task(follow())
    await r.append(chunks(b"new 1\n"))
    await r.append(chunks(b"new 2\n"))
    await asyncio.wait_for(reader, 10)
    assert b"".join(seen) == b"new 1\nnew 2\n"


async def test_the_flush_interval_rolls_an_idle_spool(tmp_path: Path) -> None:
    spec = replace(SPEC, fragment=replace(SPEC.fragment, flush_interval=timedelta(seconds=1)))
    r = replica(tmp_path, spec)
    await r.append(chunks(b"x\n"))
    task = asyncio.create_task(r.run())
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while r.spool.begin == 0:  # rolled: the new spool starts at the write head
            assert asyncio.get_running_loop().time() < deadline, "the spool never rolled"
            await asyncio.sleep(0.05)
        assert r.spool.begin == 2
    finally:
        task.cancel()


async def _rolled_replica(tmp_path: Path, persist: bool
                          ) -> tuple[Replica, list[bytes], Path, Persister, asyncio.Task[None]]:
    root = tmp_path / "root"
    stores: dict[str, object] = {}

    def store(url: str):  # type: ignore[no-untyped-def]
        return stores.setdefault(url, store_for(url, file_root=root))

    persister = Persister()
    task = asyncio.create_task(persister.run()) if persist else asyncio.create_task(
        asyncio.sleep(3600))
    r = Replica(SPEC, tmp_path / "spools", Shared(persister, store))
    appends = [(b"%04d" % i) * 250 + b"\n" for i in range(12)]
    for a in appends:
        await r.append(chunks(a))
    if persist:
        await asyncio.wait_for(persister.wait_idle(), 30)
    return r, appends, root, persister, task


async def test_reads_span_persisted_and_open_fragments(tmp_path: Path) -> None:
    r, appends, _, _, task = await _rolled_replica(tmp_path, persist=True)
    try:
        assert r.spool.begin > 0  # older content is only in the store now
        got = [c async for c in r.read(0)]
        assert b"".join(c.content for c in got) == b"".join(appends)
        assert got[0].fragment.backing_store == "file:///store/"
        tail = b"".join([c.content async for c in r.read(1001 * 7 + 5, end_offset=1001 * 8)])
        assert tail == appends[7][5:]
    finally:
        task.cancel()


async def test_reads_of_closed_spools_not_yet_persisted(tmp_path: Path) -> None:
    r, appends, _, _, task = await _rolled_replica(tmp_path, persist=False)
    try:
        assert b"".join([c.content async for c in r.read(0)]) == b"".join(appends)
    finally:
        task.cancel()


async def test_a_corrupt_stored_fragment_is_reported_never_served(tmp_path: Path) -> None:
    r, appends, root, _, task = await _rolled_replica(tmp_path, persist=True)
    try:
        first = r.index.find(0)
        assert first is not None and first.backing_store
        stored = root / "store" / first.path
        stored.write_bytes(b"X" + stored.read_bytes()[1:])  # flip a byte (codec NONE)
        with pytest.raises(CorruptFragment, match=first.path):
            async for _ in r.read(0):
                pass
        assert not any(r.state.cache.directory.glob("*-*"))  # nothing bad cached
        # The broker keeps serving what is intact.
        later = b"".join([c.content async for c in r.read(first.end)])
        assert later == b"".join(appends)[first.end:]
    finally:
        task.cancel()


async def test_a_fresh_broker_continues_after_and_serves_persisted_content(
    tmp_path: Path,
) -> None:
    first, appends, root, _, task = await _rolled_replica(tmp_path, persist=True)
    try:
        await first.roll()
        await asyncio.wait_for(first.shared.persister.wait_idle(), 30)  # type: ignore[union-attr]
        fresh = await Replica.open(SPEC, tmp_path / "fresh-spools", Shared(
            None, lambda url: store_for(url, file_root=root)))
        assert fresh.write_head == sum(map(len, appends))
        assert b"".join([c.content async for c in fresh.read(0)]) == b"".join(appends)
        more = await fresh.append(chunks(b"after\n"))
        assert more.commit.begin == sum(map(len, appends))
    finally:
        task.cancel()


async def test_retention_removes_old_fragments_from_stores_and_index(tmp_path: Path) -> None:
    spec = replace(SPEC, fragment=replace(SPEC.fragment, retention=timedelta(hours=1)))
    r, _, root, _, task = await _rolled_replica(tmp_path, persist=True)
    try:
        r.spec = spec
        stored = sorted((root / "store").rglob("*.raw"))
        assert len(stored) >= 2
        old = time.time() - 7200
        os.utime(stored[0], (old, old))  # the oldest fragment is past retention
        await r.refresh()
        assert not stored[0].exists() and all(p.exists() for p in stored[1:])
        assert r.index.fragments().begin_offset > 0
        first = [c async for c in r.read(0)]
        assert first[0].offset > 0  # the removed range is skipped as a hole
    finally:
        task.cancel()


async def test_a_read_in_a_hole_up_to_the_spool_goes_on_from_the_spool(
    tmp_path: Path,
) -> None:
    spec = replace(SPEC, fragment=replace(SPEC.fragment, retention=timedelta(hours=1)))
    r, appends, root, _, task = await _rolled_replica(tmp_path, persist=True)
    try:
        r.spec = spec
        await r.roll()
        await asyncio.wait_for(r.shared.persister.wait_idle(), 30)  # type: ignore[union-attr]
        old = time.time() - 7200
        for path in (root / "store").rglob("*.raw"):
            os.utime(path, (old, old))  # everything persisted is past retention
        await r.refresh()
        head = sum(map(len, appends))
        assert r.write_head == head and r.index.find(0) is None
        # Without block: nothing to read yet at the head the read moved to. Retention
        # explains the hole at once: no gap is waited for (a minute) and skipped.
        skipped = GAPS_SKIPPED._value.get()
        with pytest.raises(ReadError, match="OFFSET_NOT_YET_AVAILABLE"):
            await asyncio.wait_for(r.locate(0), 5)
        assert GAPS_SKIPPED._value.get() == skipped
        # A blocking read (and a blocking metadata read) waits there for the next append.
        reader = asyncio.ensure_future(anext(aiter(r.read(0, block=True))))
        located = asyncio.ensure_future(r.locate(0, block=True))
        await r.append(chunks(b"next\n"))
        chunk = await asyncio.wait_for(reader, 10)
        assert (chunk.offset, chunk.content) == (head, b"next\n")
        assert (await asyncio.wait_for(located, 10))[0] == head
    finally:
        task.cancel()


async def test_a_codec_changed_while_the_spool_is_empty_applies_to_the_next_fragment(
    tmp_path: Path,
) -> None:
    r = replica(tmp_path)
    await r.append(chunks(b"before\n"))
    await r.roll()  # everything closed: the open spool is empty
    r.update_spec(replace(SPEC, fragment=replace(SPEC.fragment,
                                                 compression_codec=CompressionCodec.GZIP)))
    await r.append(chunks(b"after\n"))
    assert r.spool.codec is CompressionCodec.GZIP
    assert (await r.roll()) == r.fragments()[-1]
    assert r.fragments()[-1].codec is CompressionCodec.GZIP
    assert [f.codec for f in r.fragments()] == [CompressionCodec.NONE, CompressionCodec.GZIP]


async def test_sums_taken_on_the_hasher_thread_match_the_content(tmp_path: Path) -> None:
    spec = replace(SPEC, fragment=replace(SPEC.fragment, length=1 << 30))
    with ThreadPoolExecutor(max_workers=1) as hasher:
        r = replica(tmp_path, spec, hasher=hasher)
        big = [os.urandom(n) for n in (100_000, 1 << 20, 7, 300_000)]
        first = await r.append(chunks(*big))
        assert first.commit.sha1 == hashlib.sha1(b"".join(big)).digest()

        async def broken() -> AsyncIterator[bytes]:
            yield os.urandom(1 << 20)
            yield os.urandom(1 << 20)
            raise ConnectionResetError("the client went away")

        with pytest.raises(ConnectionResetError):
            await r.append(broken())
        more = [os.urandom(200_000), b"tail\n"]
        second = await r.append(chunks(*more))
        assert second.commit.sha1 == hashlib.sha1(b"".join(more)).digest()
        # The spool's running SHA-1 (the fragment's name) covers exactly what committed.
        content = b"".join(big + more)
        assert r.spool.fragment.sha1 == hashlib.sha1(content).digest()
        assert r.spool.read(0, len(content) + 10) == content


async def test_the_cache_evicts_past_its_bound_and_refetches(tmp_path: Path) -> None:
    r, appends, _, _, task = await _rolled_replica(tmp_path, persist=True)
    try:
        r.state.cache.max_bytes = 6000  # about one fragment
        everything = b"".join(appends)
        for _ in range(2):
            assert b"".join([c.content async for c in r.read(0)]) == everything
            cached = list(r.state.cache.directory.glob("*-*"))
            assert sum(p.stat().st_size for p in cached) <= 6000
    finally:
        task.cancel()
