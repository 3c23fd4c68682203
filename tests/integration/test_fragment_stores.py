"""Fragment stores against real backends: a folder, and S3 on the moto server."""

from __future__ import annotations

import asyncio
import hashlib
import time
import urllib.request
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from gazette.errors import ValidationError
from gazette.fragment import Fragment, Sha1Verifier, compress, decompress
from gazette.fragment.store import (
    FileStore,
    FragmentNotFound,
    FragmentStore,
    S3Store,
    StoreError,
    store_for,
)
from gazette.protocol import CompressionCodec
from tests.fixtures.s3 import S3Bucket, S3Server

pytestmark = pytest.mark.integration

CONTENT = b"".join(b'{"Msg": "line %d"}\n' % i for i in range(3000))


def fragment(begin: int = 0, codec: CompressionCodec = CompressionCodec.SNAPPY,
             postfix: str = "", journal: str = "example/journal") -> Fragment:
    return Fragment(journal, begin, begin + len(CONTENT), hashlib.sha1(CONTENT).digest(),
                    codec, path_postfix=postfix)


def s3_url(bucket: S3Bucket, prefix: str = "fragments/") -> str:
    return f"s3://{bucket.name}/{prefix}?endpoint={bucket.server.endpoint_url}&region=us-east-1"


@pytest.fixture(params=["file", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[FragmentStore]:
    if request.param == "file":
        made: FragmentStore = store_for("file:///stores/a/", file_root=tmp_path)
    else:
        bucket: S3Bucket = request.getfixturevalue("s3_bucket")
        made = store_for(s3_url(bucket), env=bucket.server.env())
    try:
        yield made
    finally:
        await made.close()


async def read_all(store: FragmentStore, frag: Fragment, begin: int = 0,
                   end: int | None = None) -> bytes:
    return b"".join([chunk async for chunk in store.get(frag, begin, end)])


async def test_put_list_get_remove(store: FragmentStore) -> None:
    frag = fragment()
    stored = compress(frag.codec, CONTENT)
    assert not await store.exists(frag)
    assert await store.list(frag.journal) == []
    before = int(time.time()) - 2
    await store.put(frag, stored)
    assert await store.exists(frag)
    [listed] = await store.list(frag.journal)
    assert (listed.journal, listed.begin, listed.end, listed.sha1, listed.codec) == (
        frag.journal, frag.begin, frag.end, frag.sha1, frag.codec)
    assert listed.backing_store == store.url and listed.mod_time >= before
    got = await read_all(store, frag)
    assert got == stored
    check = Sha1Verifier(frag)
    check.update(decompress(frag.codec, got))
    check.verify()
    assert await read_all(store, frag, 10, 110) == stored[10:110]  # a ranged read
    await store.remove(frag)
    assert not await store.exists(frag) and await store.list(frag.journal) == []


async def test_listing_handles_postfix_folders_other_journals_and_junk(
    store: FragmentStore, tmp_path: Path
) -> None:
    plain, dated = fragment(0), fragment(len(CONTENT), postfix="date=2026-11-22/hour=03")
    other = fragment(0, journal="example/journal-2")
    for f in (plain, dated, other):
        await store.put(f, compress(f.codec, CONTENT))
    if isinstance(store, FileStore):
        (store.root / "example/journal/README.txt").write_text("not a fragment")
    else:
        assert isinstance(store, S3Store)
        s3 = await store._s3()
        await s3.put_object(Bucket=store.bucket, Key=f"{store.prefix}example/journal/x.txt",
                            Body=b"junk")
    listed = sorted(await store.list("example/journal"))
    assert [(f.begin, f.path_postfix) for f in listed] == [
        (0, ""), (len(CONTENT), "date=2026-11-22/hour=03")]


async def test_signed_url_serves_the_stored_bytes(store: FragmentStore) -> None:
    frag = fragment(codec=CompressionCodec.GZIP)
    stored = compress(frag.codec, CONTENT)
    await store.put(frag, stored)
    url = await store.sign(frag, timedelta(minutes=5))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as resp:
        assert resp.read() == stored


async def test_missing_fragments_are_reported(store: FragmentStore) -> None:
    with pytest.raises(FragmentNotFound, match="get"):
        await read_all(store, fragment(999))
    if isinstance(store, FileStore):  # (S3 deletes of absent keys succeed, by design)
        with pytest.raises(FragmentNotFound, match="remove"):
            await store.remove(fragment(999))


async def test_file_store_put_is_atomic_and_stays_under_its_root(tmp_path: Path) -> None:
    store = store_for("file:///s/", file_root=tmp_path)
    frag = fragment()
    big = b"x" * (8 << 20)
    task = asyncio.create_task(store.put(frag, big))
    # While the put runs, the fragment is either absent or whole, never partial.
    while not task.done():
        for f in await store.list(frag.journal):
            assert (store.root / f.path).stat().st_size == len(big)  # type: ignore[attr-defined]
        await asyncio.sleep(0)
    await task
    assert await read_all(store, frag) == big
    with pytest.raises(ValidationError, match=r"'\.\.'"):
        store_for("file:///../escape/", file_root=tmp_path)
    with pytest.raises(ValidationError, match=r"--broker\.file-root is not set"):
        store_for("file:///s/")
    with pytest.raises(ValidationError, match="scheme must be one of"):
        store_for("gs://bucket/x/", file_root=tmp_path)


async def test_s3_outage_fails_cleanly_and_recovers(s3_server_restartable: S3Server) -> None:
    bucket = s3_server_restartable.new_bucket()
    store = S3Store(s3_url(bucket), env=s3_server_restartable.env(), connect_timeout=1,
                    read_timeout=1, max_attempts=1, op_timeout=2)
    frag = fragment()
    try:
        await store.put(frag, b"before")
        s3_server_restartable.pause()
        try:
            with pytest.raises(StoreError, match=r"put .*no answer within 2"):
                await asyncio.wait_for(store.put(fragment(len(CONTENT)), b"during"), 30)
        finally:
            s3_server_restartable.resume()
        await store.put(fragment(len(CONTENT)), b"after")
        assert len(await store.list(frag.journal)) == 2
    finally:
        await store.close()
