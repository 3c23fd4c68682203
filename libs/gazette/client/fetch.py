"""Reading a persisted fragment straight from its store, by a (signed) URL.

The content is decoded with the fragment's codec and verified against its SHA-1 and
length as it streams (`FragmentDecoder`): a corrupt fragment raises `CorruptFragment`
and is never handed out as good. Decoding runs in a worker thread, one block at a time.
"""

from __future__ import annotations

import asyncio
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator

import aiohttp

from gazette.fragment import Fragment
from gazette.fragment.codec import FragmentDecoder

BLOCK = 1 << 20


async def fetch_fragment(url: str, fragment: Fragment, offset: int | None = None
                         ) -> AsyncIterator[bytes]:
    """`fragment`'s content from `offset` (default its begin) to its end, read from
    `url` (``file://`` or ``http(s)://``)."""
    start = fragment.begin if offset is None else offset
    if not fragment.begin <= start <= fragment.end:
        raise ValueError(f"offset {start} is outside fragment [{fragment.begin}, "
                         f"{fragment.end})")
    decoder = FragmentDecoder(fragment)
    skip = start - fragment.begin
    async for raw in _blocks(url):
        content = await asyncio.to_thread(decoder.feed, raw)
        if skip >= len(content):
            skip -= len(content)
            continue
        yield content[skip:] if skip else content
        skip = 0
    rest = decoder.finish()  # verifies the SHA-1 and length of the whole fragment
    if rest and skip < len(rest):
        yield rest[skip:]


async def _blocks(url: str) -> AsyncIterator[bytes]:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme == "file":
        path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
        fh = await asyncio.to_thread(open, path, "rb")
        try:
            while block := await asyncio.to_thread(fh.read, BLOCK):
                yield block
        finally:
            fh.close()
    elif scheme in ("http", "https"):
        async with aiohttp.ClientSession(auto_decompress=False) as http, \
                http.get(url) as resp:
            resp.raise_for_status()
            async for block in resp.content.iter_chunked(BLOCK):
                yield block
    else:
        raise ValueError(f"cannot fetch fragments from {url!r}: not a file or http URL")
