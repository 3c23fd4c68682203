"""Reading a persisted fragment straight from its store, by the (signed) URL a broker
gave: ``file://`` (read in worker threads) or ``http(s)://`` (aiohttp, fetched as stored:
no transparent decompression, the fragment's codec decodes it).

Nothing is served before it is known good: the stored file is decoded and its content's
SHA-1 and length checked against the fragment (`FragmentDecoder`) before any of it is
yielded, so a corrupt fragment raises `CorruptFragment` having yielded nothing. A large
local file is read twice (verified, then served from the same open file: fragment files
are immutable, and page-cache reads cost far less than holding the content); content
fetched over HTTP is held aside while it verifies, in memory up to `MEMORY_LIMIT` and in
an anonymous temp file beyond. Reads and decoding run in worker threads, a block at a
time, so the event loop never stalls on a large fragment.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator
from typing import IO

from gazette.errors import ValidationError
from gazette.fragment import CodecError, CorruptFragment, Decompressor, Fragment
from gazette.fragment.codec import FragmentDecoder
from gazette.protocol import CompressionCodec

#: Bytes read (and decoded) per worker-thread call, and the largest chunk yielded.
BLOCK = 1 << 20
#: Bytes read and verified per worker-thread call (fewer hand-offs than `BLOCK`).
VERIFY_BLOCK = 8 << 20
#: Verified content of one fragment held in memory before it spills to a temp file.
MEMORY_LIMIT = 32 << 20
#: HTTP fetches: a connect and per-read timeout (seconds), no total (fragments may be
#: large).
HTTP_CONNECT_TIMEOUT, HTTP_READ_TIMEOUT = 30, 60


async def fetch_fragment(url: str, fragment: Fragment, offset: int | None = None
                         ) -> AsyncGenerator[bytes, None]:
    """`fragment`'s content from `offset` (default: its begin) to its end, read from
    `url` and verified before any of it is yielded, in chunks of up to `BLOCK` bytes.
    Raises `CorruptFragment` if the stored file does not decode to the fragment's
    content, `OSError` (`FetchError` over HTTP) if it cannot be read."""
    start = fragment.begin if offset is None else offset
    if not fragment.begin <= start <= fragment.end:
        raise ValidationError("offset", f"{start} is outside fragment {fragment.path} "
                              f"[{fragment.begin}, {fragment.end})")
    parts = urllib.parse.urlsplit(url)
    source: AsyncGenerator[bytes, None]
    if parts.scheme == "file":
        source = _file_content(urllib.request.url2pathname(parts.path), fragment, start)
    elif parts.scheme in ("http", "https"):
        source = _http_content(url, fragment, start)
    else:
        raise ValidationError("url", f"cannot fetch fragments from {url!r}: not a file:// "
                              "or http(s):// URL")
    async with contextlib.aclosing(source):
        async for chunk in source:
            yield chunk


async def _file_content(path: str, fragment: Fragment, start: int
                        ) -> AsyncGenerator[bytes, None]:
    fh = await _open(path)
    try:
        if fragment.codec is not CompressionCodec.NONE and fragment.size <= MEMORY_LIMIT:
            # Small enough to hold: decompress once, verify, then serve what was held.
            content = await asyncio.to_thread(_decode_whole, fh, fragment)
            skip = start - fragment.begin
            if skip == 0 and len(content) <= BLOCK:
                yield content
                return
            for i in range(skip, len(content), BLOCK):
                yield content[i:i + BLOCK]
            return
        decoder = FragmentDecoder(fragment)
        while await asyncio.to_thread(_verify_block, fh, decoder):
            pass
        await asyncio.to_thread(decoder.finish)  # raises CorruptFragment
        if fragment.codec is CompressionCodec.NONE:
            await asyncio.to_thread(fh.seek, start - fragment.begin)
            pos = start
            while pos < fragment.end:
                block = await asyncio.to_thread(fh.read, min(BLOCK, fragment.end - pos))
                if not block:
                    raise CorruptFragment(fragment, None, reason="the file shrank after "
                                          "it was verified")
                yield block
                pos += len(block)
            return
        await asyncio.to_thread(fh.seek, 0)
        decompressor = Decompressor(fragment.codec, limit=fragment.size)
        skip = start - fragment.begin
        while True:
            content, more = await asyncio.to_thread(_decode_block, fh, decompressor, fragment)
            if skip:
                cut = min(skip, len(content))
                content, skip = content[cut:], skip - cut
            for i in range(0, len(content), BLOCK):
                yield content[i:i + BLOCK] if len(content) > BLOCK else content
            if not more:
                return
    finally:
        await asyncio.to_thread(fh.close)


def _decode_whole(fh: IO[bytes], fragment: Fragment) -> bytes:
    """The verified content of a (compressed) fragment file, decoded once."""
    decoder = FragmentDecoder(fragment)
    out = bytearray()
    while raw := fh.read(VERIFY_BLOCK):
        out += decoder.feed(raw)
    out += decoder.finish()  # raises CorruptFragment
    return bytes(out)


def _verify_block(fh: IO[bytes], decoder: FragmentDecoder) -> bool:
    raw = fh.read(VERIFY_BLOCK)
    if raw:
        decoder.feed(raw)
    return bool(raw)


def _decode_block(fh: IO[bytes], decompressor: Decompressor, fragment: Fragment
                  ) -> tuple[bytes, bool]:
    raw = fh.read(BLOCK)
    try:
        return (decompressor.feed(raw), True) if raw else (decompressor.finish(), False)
    except CodecError as err:  # it verified a moment ago: the file changed
        raise CorruptFragment(fragment, None, reason=str(err)) from err


async def _http_content(url: str, fragment: Fragment, start: int
                        ) -> AsyncGenerator[bytes, None]:
    held = _Held(start - fragment.begin)
    try:
        decoder = FragmentDecoder(fragment)
        async with contextlib.aclosing(_decoded(url, decoder)) as decoded:
            async for content in decoded:
                await held.add(content)
        await held.add(await asyncio.to_thread(decoder.finish))  # verifies SHA-1, length
        async with contextlib.aclosing(held.replay()) as replay:
            async for chunk in replay:
                yield chunk
    finally:
        await held.close()


class FetchError(OSError):
    """Fetching a fragment over HTTP failed (connection, timeout, HTTP status)."""


async def _decoded(url: str, decoder: FragmentDecoder) -> AsyncGenerator[bytes, None]:
    """Content decoded from the HTTP response for `url`, a block at a time."""
    import aiohttp  # here: only HTTP fetches need it, and it takes ~0.15 s to import

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=HTTP_CONNECT_TIMEOUT,
                                    sock_read=HTTP_READ_TIMEOUT)
    try:
        async with aiohttp.ClientSession(auto_decompress=False, timeout=timeout) as http, \
                http.get(url) as resp:
            resp.raise_for_status()
            pending: list[bytes] = []
            size = 0
            async for data in resp.content.iter_chunked(BLOCK):
                pending.append(data)
                size += len(data)
                if size >= BLOCK:
                    yield await asyncio.to_thread(decoder.feed, b"".join(pending))
                    pending, size = [], 0
            if pending:
                yield await asyncio.to_thread(decoder.feed, b"".join(pending))
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise FetchError(f"fetching {url.split('?')[0]}: {exc}") from exc


async def _open(path: str) -> IO[bytes]:
    """`path` opened in a worker thread; closed again if we are cancelled meanwhile (so
    that no file descriptor leaks)."""
    opening = asyncio.ensure_future(asyncio.to_thread(open, path, "rb", buffering=0))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(
            lambda f: f.result().close() if not f.cancelled() and not f.exception() else None)
        raise


class _Held:
    """Decoded content (from `skip` bytes in) kept aside until the fragment verifies."""

    def __init__(self, skip: int) -> None:
        self._skip = skip
        self._memory: list[bytes] = []
        self._size = 0
        self._file: IO[bytes] | None = None

    async def add(self, content: bytes) -> None:
        if self._skip:
            cut = min(self._skip, len(content))
            content, self._skip = content[cut:], self._skip - cut
        if not content:
            return
        self._size += len(content)
        if self._file is None and self._size <= MEMORY_LIMIT:
            self._memory.append(content)
            return
        if self._file is None:
            spill: IO[bytes] = await asyncio.to_thread(tempfile.TemporaryFile,
                                                       prefix="gazette-fragment-")
            self._file = spill
            held, self._memory = self._memory, []
            await asyncio.to_thread(spill.writelines, held)
        else:
            spill = self._file
        await asyncio.to_thread(spill.write, content)

    async def replay(self) -> AsyncGenerator[bytes, None]:
        for content in self._memory:
            for i in range(0, len(content), BLOCK):
                yield content[i:i + BLOCK] if len(content) > BLOCK else content
        self._memory = []
        if self._file is not None:
            await asyncio.to_thread(self._file.seek, 0)
            while block := await asyncio.to_thread(self._file.read, BLOCK):
                yield block

    async def close(self) -> None:
        self._memory = []
        if self._file is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self._file.close)
            self._file = None
