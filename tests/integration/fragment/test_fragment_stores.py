"""Fragment stores against real backends: a folder, and S3 on the moto server."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gazette.errors import ValidationError
from gazette.fragment import Fragment, Sha1Verifier, compress, decompress
from gazette.fragment.store import (
    CHUNK_SIZE,
    FileStore,
    FragmentNotFound,
    FragmentStore,
    S3Store,
    SealedFile,
    StoreError,
    aclose_all,
    client_pool,
    store_for,
)
from gazette.fragment.store.file import FILE_MODE, TEMP_PREFIX
from gazette.protocol import CompressionCodec
from tests.fixtures.s3 import S3Bucket, S3Server

pytestmark = pytest.mark.integration

MiB = 1 << 20
JOURNAL = "example/journal"
CONTENT = b"".join(b'{"Msg": "line %d"}\n' % i for i in range(3000))


def fragment(begin: int = 0, codec: CompressionCodec = CompressionCodec.SNAPPY,
             postfix: str = "", journal: str = JOURNAL, content: bytes = CONTENT) -> Fragment:
    return Fragment(journal, begin, begin + len(content), hashlib.sha1(content).digest(),
                    codec, path_postfix=postfix)


def s3_url(bucket: S3Bucket, prefix: str = "fragments/") -> str:
    return f"s3://{bucket.name}/{prefix}?endpoint={bucket.server.endpoint_url}&region=us-east-1"


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path,
               **s3_options: Any) -> FragmentStore:
    if kind == "file":
        return store_for("file:///stores/a/", file_root=tmp_path)
    bucket: S3Bucket = request.getfixturevalue("s3_bucket")
    return store_for(s3_url(bucket), env=bucket.server.env(), s3_options=s3_options)


@pytest.fixture(params=["file", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[FragmentStore]:
    made = make_store(request.param, request, tmp_path)
    try:
        yield made
    finally:
        await made.close()


async def read_all(store: FragmentStore, frag: Fragment, begin: int = 0,
                   end: int | None = None) -> bytes:
    return b"".join([chunk async for chunk in store.get(frag, begin, end)])


async def eventually(check: Callable[[], Awaitable[bool]], what: str,
                     timeout: float = 15.0) -> None:
    """Poll `check` until it holds, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.02)


def fetch(url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as resp:
        return bytes(resp.read())


async def pending_uploads(store: S3Store) -> list[str]:
    s3 = await store.client()
    resp = await s3.list_multipart_uploads(Bucket=store.bucket)
    return [u["Key"] for u in resp.get("Uploads", [])]


def temp_files(store: FileStore) -> list[Path]:
    return [p for p in store.root.rglob("*") if p.name.startswith(TEMP_PREFIX)]


# -- the common contract ---------------------------------------------------------------


async def test_put_list_get_exists_remove(store: FragmentStore) -> None:
    frag = fragment()
    stored = compress(frag.codec, CONTENT)
    assert not await store.exists(frag)
    assert await store.list(frag.journal) == []
    before = int(time.time()) - 2
    await store.put(frag, stored)
    assert await store.exists(frag)
    [listed] = await store.list(frag.journal)
    assert listed == replace(frag, backing_store=store.url, mod_time=listed.mod_time)
    assert before <= listed.mod_time <= time.time() + 2
    got = await read_all(store, frag)
    assert got == stored
    check = Sha1Verifier(frag)
    check.update(decompress(frag.codec, got))
    check.verify()
    assert await read_all(store, frag, 10, 110) == stored[10:110]
    await store.remove(frag)
    assert not await store.exists(frag) and await store.list(frag.journal) == []
    await store.remove(frag)  # removing what is gone is no error


async def test_list_under_finds_every_journal_below_a_prefix(store: FragmentStore) -> None:
    content = b"x\n"
    frags = [fragment(0, journal=j, content=content)
             for j in ("events/a", "events/b/part-1", "eventsx/c", "other/d")]
    frags.append(fragment(0, journal="events/a", content=content, postfix="date=2026-11-24"))
    for f in frags:
        await store.put(f, compress(f.codec, content))

    def names(found: list[Fragment]) -> list[tuple[str, str]]:
        assert all(f.backing_store == store.url for f in found)
        return sorted((f.journal, f.path_postfix) for f in found)

    assert names(await store.list_under("events/")) == [
        ("events/a", ""), ("events/a", "date=2026-11-24"), ("events/b/part-1", "")]
    assert names(await store.list_under("events")) == [
        ("events/a", ""), ("events/a", "date=2026-11-24"), ("events/b/part-1", ""),
        ("eventsx/c", "")]
    assert len(await store.list_under()) == 5
    assert await store.list_under("nothing/") == []
    for bad in ("../", "/abs", "a/../../b"):
        with pytest.raises(ValidationError, match="prefix"):
            await store.list_under(bad)


async def test_gets_stream_chunks_and_ranges_act_like_slices(store: FragmentStore) -> None:
    stored = random.Random(7).randbytes(3 * CHUNK_SIZE + 12345)
    frag = fragment(codec=CompressionCodec.NONE, content=stored)
    await store.put(frag, stored)
    chunks = [c async for c in store.get(frag)]
    assert len(chunks) > 1 and max(map(len, chunks)) <= CHUNK_SIZE
    assert b"".join(chunks) == stored
    n = len(stored)
    for begin, end in [(0, None), (10, 110), (CHUNK_SIZE - 3, CHUNK_SIZE + 3), (n - 5, None),
                       (n - 5, n + 100), (n, None), (n + 10, n + 20), (7, 7), (0, 1)]:
        got = await read_all(store, frag, begin, end)
        assert got == stored[begin:end], (begin, end)
    for begin, end in [(-1, None), (10, 9)]:
        with pytest.raises(ValueError):
            await read_all(store, frag, begin, end)
    # A reader that stops early releases the object when it closes the iterator.
    reader = store.get(frag)
    first = await anext(reader)
    await reader.aclose()  # type: ignore[attr-defined]
    assert first == stored[:len(first)]


async def test_put_from_a_local_file_and_replace(store: FragmentStore, tmp_path: Path) -> None:
    frag = fragment()
    stored = compress(frag.codec, CONTENT)
    local = tmp_path / "upload.sz"
    local.write_bytes(stored)
    await store.put(frag, local)
    assert await read_all(store, frag) == stored
    await store.put(frag, b"replaced")  # a second put of a name replaces it whole
    assert await read_all(store, frag) == b"replaced"
    assert len(await store.list(frag.journal)) == 1
    with pytest.raises(StoreError, match="local file") as info:
        await store.put(fragment(999), tmp_path / "no-such-file")
    assert not isinstance(info.value, FragmentNotFound)
    assert not await store.exists(fragment(999))


async def test_file_store_copies_a_local_file_where_the_kernel_cannot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file store copies a local file with copy_file_range; where the file systems do
    not support it (EXDEV across them on older kernels, EINVAL on some), after it may have
    copied part, it copies by reads and writes, and the object is whole."""
    store = store_for("file:///stores/a/", file_root=tmp_path)
    frag = fragment(codec=CompressionCodec.NONE)
    local = tmp_path / "upload"
    local.write_bytes(CONTENT)
    real = os.copy_file_range
    calls = 0

    def partial_then_refused(src: int, dst: int, count: int, *args: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real(src, dst, 1000)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", partial_then_refused)
    await store.put(frag, local)
    assert calls == 2
    assert await read_all(store, frag) == CONTENT
    await store.close()


async def test_file_store_links_a_sealed_file_and_copies_where_it_cannot_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `SealedFile` (a closed spool) on the store's file system is hard-linked, not
    copied, with the mode a copy would get; across file systems (EXDEV) it is copied.
    Either way the object is whole and outlives the local file."""
    store = store_for("file:///stores/a/", file_root=tmp_path)
    local = tmp_path / "spool-1"
    local.write_bytes(CONTENT)
    local.chmod(0o600)  # as mkstemp makes spools
    linked = fragment(codec=CompressionCodec.NONE)
    await store.put(linked, SealedFile(local))
    stored = store.path_of(linked)  # type: ignore[attr-defined]
    assert stored.stat().st_ino == local.stat().st_ino
    assert stored.stat().st_mode & 0o777 == FILE_MODE
    local.unlink()
    assert await read_all(store, linked) == CONTENT

    local.write_bytes(CONTENT)
    monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.EXDEV, "Invalid cross-device link")))
    copied = fragment(begin=len(CONTENT), codec=CompressionCodec.NONE)
    await store.put(copied, SealedFile(local))
    assert store.path_of(copied).stat().st_ino != local.stat().st_ino  # type: ignore[attr-defined]
    assert await read_all(store, copied) == CONTENT
    await store.close()


async def test_listing_finds_postfix_folders_and_skips_others_and_junk(
    store: FragmentStore, caplog: pytest.LogCaptureFixture
) -> None:
    plain = fragment(0)
    dated = fragment(len(CONTENT), postfix="date=2026-11-22/hour=03")
    other = fragment(0, journal="example/journal-2")
    child = fragment(0, journal="example/journal/child")  # a journal named like a folder
    for f in (plain, dated, other, child):
        await store.put(f, compress(f.codec, CONTENT))
    junk = [f"{JOURNAL}/README.txt", f"{JOURNAL}/date=2026-11-22/notes.json"]
    if isinstance(store, FileStore):
        for name in junk:
            (store.root / name).write_text("not a fragment")
        # What a crash mid-put leaves behind is skipped without a word.
        (store.root / JOURNAL / f"{TEMP_PREFIX}0123-{plain.content_name}").write_bytes(b"x")
    else:
        assert isinstance(store, S3Store)
        s3 = await store.client()
        for name in junk:
            await s3.put_object(Bucket=store.bucket, Key=store.prefix + name, Body=b"junk")
    with caplog.at_level(logging.WARNING):
        listed = sorted(await store.list(JOURNAL))
    assert [(f.begin, f.path_postfix, f.journal) for f in listed] == [
        (0, "", JOURNAL), (len(CONTENT), "date=2026-11-22/hour=03", JOURNAL)]
    assert all(f.backing_store == store.url and f.mod_time > 0 for f in listed)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "README.txt" in warned and "notes.json" in warned and TEMP_PREFIX not in warned
    assert [f.journal for f in await store.list("example/journal/child")] == [child.journal]
    assert [f.journal for f in await store.list("example/journal-2")] == [other.journal]
    assert await store.list("example/nothing-here") == []


async def test_signed_url_serves_the_stored_bytes(store: FragmentStore) -> None:
    frag = fragment(codec=CompressionCodec.GZIP)
    stored = compress(frag.codec, CONTENT)
    await store.put(frag, stored)
    url = await store.sign(frag, timedelta(minutes=5))
    if isinstance(store, FileStore):
        local = Path(urllib.request.url2pathname(url.removeprefix("file://")))
        assert url.startswith("file:///") and local.is_absolute()
        assert await asyncio.to_thread(local.read_bytes) == stored
    else:
        assert "X-Amz-Signature=" in url and "X-Amz-Expires=300" in url
    assert await asyncio.to_thread(fetch, url) == stored


async def test_missing_fragments_are_reported(store: FragmentStore) -> None:
    missing = fragment(999)
    with pytest.raises(FragmentNotFound) as info:
        await read_all(store, missing)
    err = info.value
    assert isinstance(err, StoreError)
    assert (err.store, err.op, err.obj) == (store.url, "get", missing.path)
    assert store.url in str(err) and missing.path in str(err)
    for begin, end in [(10, 20), (5, 5)]:
        with pytest.raises(FragmentNotFound):
            await read_all(store, missing, begin, end)
    assert not await store.exists(missing)
    await store.remove(missing)


@pytest.mark.parametrize("kind", ["file", "s3"])
async def test_a_put_is_atomic(kind: str, request: pytest.FixtureRequest,
                               tmp_path: Path) -> None:
    # Small parts, so that S3 takes a multipart upload of several parts.
    store = make_store(kind, request, tmp_path, part_size=5 * MiB,
                       multipart_threshold=8 * MiB)
    try:
        big = random.Random(1).randbytes(24 * MiB)
        frag = fragment(codec=CompressionCodec.NONE, content=big)
        put = asyncio.create_task(store.put(frag, big))
        looks, saw_parts = 0, False
        # While the put runs, the fragment is absent or whole, never partial.
        while not put.done():
            looks += 1
            if await store.list(frag.journal) or await store.exists(frag):
                assert await read_all(store, frag) == big
            if isinstance(store, S3Store):
                saw_parts = saw_parts or bool(await pending_uploads(store))
        await put
        assert looks > 1, "the put finished before the test could look at it"
        assert saw_parts or isinstance(store, FileStore), "no multipart upload was seen"
        assert len(await store.list(frag.journal)) == 1
        assert await read_all(store, frag) == big
        if isinstance(store, FileStore):
            assert temp_files(store) == []
        else:
            assert isinstance(store, S3Store)
            assert await pending_uploads(store) == []
    finally:
        await store.close()


# -- S3 specifics ----------------------------------------------------------------------


async def test_s3_cancelled_multipart_put_leaves_nothing(s3_bucket: S3Bucket) -> None:
    store = store_for(s3_url(s3_bucket), env=s3_bucket.server.env(),
                      s3_options={"part_size": 5 * MiB, "multipart_threshold": 5 * MiB})
    assert isinstance(store, S3Store)
    try:
        big = random.Random(2).randbytes(80 * MiB)
        frag = fragment(codec=CompressionCodec.NONE, content=big)
        put = asyncio.create_task(store.put(frag, big))

        async def started() -> bool:
            return bool(await pending_uploads(store))

        await eventually(started, "the multipart upload to start")
        assert not put.done()
        put.cancel()
        with pytest.raises(asyncio.CancelledError):
            await put

        async def aborted() -> bool:
            return await pending_uploads(store) == []

        await eventually(aborted, "the multipart upload to be aborted")
        assert not await store.exists(frag) and await store.list(frag.journal) == []
    finally:
        await store.close()


async def test_s3_object_headers(s3_bucket: S3Bucket) -> None:
    store = store_for(s3_url(s3_bucket), env=s3_bucket.server.env())
    assert isinstance(store, S3Store)
    try:
        s3 = await store.client()
        offload = fragment(codec=CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION)
        plain = fragment(len(CONTENT), codec=CompressionCodec.GZIP)
        stored = compress(CompressionCodec.GZIP, CONTENT)
        for f in (offload, plain):
            await store.put(f, stored)
        head = await s3.head_object(Bucket=store.bucket, Key=store.prefix + offload.path)
        assert head["ContentType"] == "application/octet-stream"
        assert head["ContentEncoding"] == "gzip"
        head = await s3.head_object(Bucket=store.bucket, Key=store.prefix + plain.path)
        assert head["ContentType"] == "application/octet-stream"
        assert "ContentEncoding" not in head
        # Whatever the headers, the store reads back the stored (compressed) bytes.
        assert await read_all(store, offload) == stored
        assert await read_all(store, offload, 5, 50) == stored[5:50]
    finally:
        await store.close()


async def test_s3_settings_come_from_the_environment(s3_bucket: S3Bucket) -> None:
    # No endpoint or region in the URL: AWS_ENDPOINT_URL_S3 and AWS_REGION of `env`.
    env = s3_bucket.server.env()
    store = store_for(f"s3://{s3_bucket.name}/env%20prefix/", env=env)
    assert isinstance(store, S3Store)
    try:
        assert store.settings.endpoint == s3_bucket.server.endpoint_url
        assert store.settings.region == s3_bucket.server.region
        assert store.settings.addressing_style == "path"  # an endpoint is configured
        assert store.prefix == "env prefix/"
        frag = fragment()
        await store.put(frag, b"stored")
        s3 = await store.client()
        got = await s3.get_object(Bucket=s3_bucket.name, Key="env prefix/" + frag.path)
        async with got["Body"] as body:
            assert await body.read() == b"stored"
    finally:
        await store.close()
    virtual = store_for(f"s3://{s3_bucket.name}/", env={**env, "AWS_S3_ADDRESSING_STYLE":
                                                         "virtual"})
    assert isinstance(virtual, S3Store) and virtual.settings.addressing_style == "virtual"
    aws = store_for("s3://some-bucket/?region=eu-west-1", env={})
    assert isinstance(aws, S3Store)
    assert (aws.settings.endpoint, aws.settings.addressing_style) == (None, None)


async def test_s3_clients_are_shared_counted_and_closed(s3_bucket: S3Bucket) -> None:
    env = s3_bucket.server.env()
    a = store_for(s3_url(s3_bucket, "a/"), env=env)
    b = store_for(s3_url(s3_bucket, "b/"), env=env)
    slow = store_for(s3_url(s3_bucket, "c/"), env=env, s3_options={"read_timeout": 5})
    assert isinstance(a, S3Store) and isinstance(b, S3Store) and isinstance(slow, S3Store)
    pool = client_pool()
    try:
        assert await a.client() is await b.client()  # one bucket, one endpoint: one client
        assert await slow.client() is not await a.client()  # other settings: another
        assert len(pool) == 2
        await slow.close()
        assert len(pool) == 1
        # Many first uses at once take one reference, which close() gives back.
        fresh = store_for(s3_url(s3_bucket, "d/"), env=env, s3_options={"read_timeout": 7})
        await asyncio.gather(*(fresh.list(JOURNAL) for _ in range(10)))
        assert len(pool) == 2
        await fresh.close()
        await a.close()
        await b.put(fragment(), b"b still works")
        await b.close()
        assert len(pool) == 0
        # A closed store reconnects when used again; so do stores after aclose_all().
        assert await a.list(JOURNAL) == []
        await aclose_all()
        assert len(pool) == 0
        assert [f.backing_store for f in await b.list(JOURNAL)] == [b.url]
    finally:
        for s in (a, b, slow):
            await s.close()
    assert len(pool) == 0


async def test_s3_outage_fails_within_the_timeouts_and_recovers(
    s3_server_restartable: S3Server,
) -> None:
    server = s3_server_restartable
    bucket = server.new_bucket()
    url = s3_url(bucket)
    env = server.env()
    store = store_for(url, env=env, s3_options={
        "connect_timeout": 1, "read_timeout": 1, "max_attempts": 1, "op_timeout": 10})
    # Long read timeouts: only the bound on the whole operation ends a hung call.
    patient = store_for(url, env=env, s3_options={
        "read_timeout": 60, "max_attempts": 1, "op_timeout": 1.5})
    frag, later, during = fragment(), fragment(len(CONTENT)), fragment(2 * len(CONTENT))
    try:
        await store.put(frag, b"before")
        await patient.list(JOURNAL)
        server.pause()
        try:
            started = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(
                store.put(during, b"during"), store.list(JOURNAL), store.exists(frag),
                read_all(store, frag), store.remove(fragment(999)),
                patient.put(during, b"during"),
                return_exceptions=True), 30)
            elapsed = time.monotonic() - started
            for result in results:
                assert isinstance(result, StoreError), result
                assert not isinstance(result, FragmentNotFound)
            assert [r.op for r in results if isinstance(r, StoreError)] == [
                "put", "list", "exists", "get", "remove", "put"]
            assert "Read timeout" in str(results[0])  # the read timeout, not op_timeout
            assert "no answer within 1.5s" in str(results[-1])
            assert elapsed < 8, f"failing took {elapsed:.1f}s"
        finally:
            server.resume()

        async def recovered() -> bool:
            with contextlib.suppress(StoreError):
                await store.put(later, b"after")
                return True
            return False

        await eventually(recovered, "puts to succeed after the outage")
        # (Requests the frozen server had received may still be carried out after it
        # thaws: a timeout does not say that nothing happened.)
        begins = {f.begin for f in await store.list(JOURNAL)}
        assert {frag.begin, later.begin} <= begins <= {frag.begin, later.begin, during.begin}
        assert await read_all(store, frag) == b"before"
        assert await read_all(patient, later) == b"after"
    finally:
        await store.close()
        await patient.close()


async def test_s3_signed_url_lifetimes(s3_bucket: S3Bucket) -> None:
    # (moto does not enforce X-Amz-Expires, so only the URLs themselves are checked.)
    store = store_for(s3_url(s3_bucket), env=s3_bucket.server.env())
    try:
        frag = fragment()
        await store.put(frag, b"signed")
        for ttl, expires in [(timedelta(seconds=1), 1), (timedelta(0), 1),
                             (timedelta(hours=1), 3600), (timedelta(days=30), 604800)]:
            url = await store.sign(frag, ttl)
            assert f"X-Amz-Expires={expires}&" in url  # at most SigV4's 7 days
            assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url
            assert url.startswith(f"{s3_bucket.server.endpoint_url}/{s3_bucket.name}/")
            assert await asyncio.to_thread(fetch, url) == b"signed"
    finally:
        await store.close()


# -- file store specifics and configuration errors -------------------------------------


async def test_file_store_stays_under_its_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")
    (root / "inside").symlink_to(root / "real")
    with pytest.raises(ValidationError, match="outside the file root"):
        store_for("file:///escape/", file_root=root)
    inner = store_for("file:///inside/", file_root=root)
    assert isinstance(inner, FileStore) and inner.root == (root / "real").resolve()
    spaced = store_for("file:///my%20store/", file_root=root)
    assert isinstance(spaced, FileStore) and spaced.root == root.resolve() / "my store"
    whole = store_for("file:///", file_root=root)
    assert isinstance(whole, FileStore) and whole.root == root.resolve()
    # Names that would climb out are refused, whatever reaches the store.
    with pytest.raises(ValidationError):
        await whole.list("../outside")
    with pytest.raises(ValidationError):
        await whole.put(fragment(journal="../../outside"), b"x")
    with pytest.raises(ValidationError):
        await whole.put(fragment(postfix="date=1/../.."), b"x")
    assert list((tmp_path / "outside").iterdir()) == []


async def test_file_store_files_are_durable_and_readable(tmp_path: Path) -> None:
    store = store_for("file:///s/", file_root=tmp_path)
    assert isinstance(store, FileStore)
    frag = fragment(postfix="date=2026-11-22")
    await store.put(frag, b"content")
    path = store.path_of(frag)
    assert path == store.file_root / "s" / frag.path
    assert await asyncio.to_thread(path.read_bytes) == b"content"
    # Permissions as for any new file (the umask decides), not mkstemp's 0600.
    reference = tmp_path / "reference"
    await asyncio.to_thread(reference.write_bytes, b"")
    assert path.stat().st_mode & 0o777 == reference.stat().st_mode & 0o777
    assert temp_files(store) == []


def test_store_urls_are_checked(tmp_path: Path) -> None:
    bad: dict[str, str] = {
        "file:///../x/": r"'\.\.'",
        "file:///%2e%2e/x/": r"'\.\.'",
        "file:///a/b": "must end with '/'",
        "file://host/a/": "no host",
        "gs://bucket/x/": "scheme must be one of",
        "s3://Bad_Bucket/": "not a valid S3 bucket",
        "s3://bucket/?endpoint=http://x&colour=red": "unknown parameter 'colour'",
        "s3://bucket/?endpoint=ftp://x.example": "not an http",
    }
    for url, message in bad.items():
        with pytest.raises(ValidationError, match=message):
            store_for(url, file_root=tmp_path, env={})
    with pytest.raises(ValidationError, match=r"--broker\.file-root is not set"):
        store_for("file:///s/")
    with pytest.raises(ValidationError, match="addressing style"):
        store_for("s3://bucket/", env={"AWS_S3_ADDRESSING_STYLE": "sideways"})
    with pytest.raises(ValueError, match="part_size"):
        store_for("s3://bucket/", env={}, s3_options={"part_size": 1024})
    s3 = store_for("s3://bucket/deep/prefix/?region=eu-west-1&profile=p&sse=AES256", env={})
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix, s3.settings.region, s3.settings.profile) == (
        "bucket", "deep/prefix/", "eu-west-1", "p")
