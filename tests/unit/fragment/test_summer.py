"""ThreadedSha1: the same sum as hashlib, whatever mix of chunk sizes, in order."""

from __future__ import annotations

import asyncio
import hashlib
import os
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
