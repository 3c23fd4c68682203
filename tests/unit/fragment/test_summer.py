"""ThreadedSha1: the same sum as hashlib, whatever mix of chunk sizes, in order."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from gazette.fragment.summer import INLINE_BYTES, ThreadedSha1


async def test_sums_like_hashlib_in_order_with_bounded_waiting() -> None:
    chunks = [os.urandom(n) for n in (10, 1 << 20, 5, INLINE_BYTES, 3, 2 << 20, 1, 0, 77)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        summer = ThreadedSha1(pool, depth=2)
        for chunk in chunks:
            await summer.update(chunk)
            assert len(summer._pending) <= 2
        assert await summer.digest() == hashlib.sha1(b"".join(chunks)).digest()
    inline = ThreadedSha1(None)
    for chunk in chunks:
        await inline.update(chunk)
    assert await inline.digest() == hashlib.sha1(b"".join(chunks)).digest()


async def test_many_appends_share_one_thread() -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        async def one(seed: int) -> bool:
            parts = [os.urandom(INLINE_BYTES + seed) for _ in range(5)]
            summer = ThreadedSha1(pool)
            for part in parts:
                await summer.update(part)
                await asyncio.sleep(0)
            return await summer.digest() == hashlib.sha1(b"".join(parts)).digest()

        assert all(await asyncio.gather(*(one(i) for i in range(8))))


async def test_also_sums_into_other_hashes_on_the_thread() -> None:
    spool_sum = hashlib.sha1(b"earlier")
    chunks = [os.urandom(INLINE_BYTES * 2), b"x", os.urandom(INLINE_BYTES)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        summer = ThreadedSha1(pool, also=[spool_sum])
        for chunk in chunks:
            await summer.update(chunk)
        assert await summer.digest() == hashlib.sha1(b"".join(chunks)).digest()
    assert spool_sum.digest() == hashlib.sha1(b"earlier" + b"".join(chunks)).digest()


async def test_writes_in_order_on_the_writer_thread_and_settle_waits_for_them() -> None:
    """Large chunks are written on the writer's thread (not the loop's), small ones on
    the loop, all in order; after `settle` nothing more is written (a rollback may cut
    the file then), even when a write failed."""
    loop_thread = threading.get_ident()
    written: list[tuple[bytes, bool]] = []

    def write(chunk: bytes | memoryview) -> None:
        written.append((bytes(chunk), threading.get_ident() != loop_thread))

    chunks = [os.urandom(INLINE_BYTES * 3), os.urandom(10), os.urandom(INLINE_BYTES),
              os.urandom(1 << 20), os.urandom(5)]
    with ThreadPoolExecutor(max_workers=1) as hasher, \
            ThreadPoolExecutor(max_workers=1) as writer:
        summer = ThreadedSha1(hasher, write=write, writer=writer)
        for chunk in chunks:
            await summer.update(chunk)
        assert await summer.digest() == hashlib.sha1(b"".join(chunks)).digest()
        assert [c for c, _ in written] == chunks
        assert written[0][1] and written[3][1], "large chunks are written off the loop"
        first_small = ThreadedSha1(hasher, write=write, writer=writer)
        written.clear()
        await first_small.update(b"tiny")  # nothing pending: on the loop
        assert written == [(b"tiny", False)]

        def failing(chunk: bytes | memoryview) -> None:
            raise OSError(28, "No space left on device")

        broken = ThreadedSha1(hasher, write=failing, writer=writer)
        await broken.update(os.urandom(INLINE_BYTES * 2))
        await broken.settle()  # the failure is the append's to raise, not settle's
        assert not broken._pending
