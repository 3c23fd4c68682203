"""`COPY` and `PATCH` operations applied to a player's files: blocks read from files
mapped in memory (no system call per block), and with numpy, when it is there, gathered
and written a whole operation at a time (a checkpoint's copy names ~10,000 pages, a
patch ~2,600 blocks: per-block Python was most of a player's time on such logs)."""

from __future__ import annotations

import mmap
import os
from types import ModuleType
from typing import Any

from gazette.recoverylog.ops import copies, patch_table, patched, xor

_np: ModuleType | None
try:
    import numpy as _np
except ImportError:  # pragma: no cover - numpy comes with the sqlite extra
    _np = None
#: A patch's blocks and a copy's pairs, as `ops` packs them (numpy's dtypes).
PATCH_BLOCK_DTYPE: Any = None if _np is None else \
    _np.dtype([("fnode", "<u4"), ("offset", "<u8"), ("length", "<u4")])
COPY_PAIR_DTYPE: Any = None if _np is None else \
    _np.dtype([("source", "<u8"), ("offset", "<u8")])


class MappedFiles:
    """Files mapped (shared, read and write), by fnode: a map is made again once a
    file outgrew it, and dropped before a file is truncated or closed (a map past a
    file's end must not be touched)."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple[mmap.mmap, memoryview]] = {}

    def view(self, fnode: int, fd: int, end: int) -> memoryview | None:
        """File `fnode`'s bytes, at least through `end` (None: it is shorter)."""
        held = self._maps.get(fnode)
        if held is not None and len(held[1]) >= end:
            return held[1]
        self.drop(fnode)
        size = os.fstat(fd).st_size
        if size < end or size == 0:
            return None
        mapped = mmap.mmap(fd, size)
        self._maps[fnode] = (mapped, memoryview(mapped))
        return self._maps[fnode][1]

    def drop(self, fnode: int) -> None:
        held = self._maps.pop(fnode, None)
        if held is not None:
            held[1].release()
            held[0].close()

    def close(self) -> None:
        for fnode in list(self._maps):
            self.drop(fnode)


def apply_copy(maps: MappedFiles, fds: dict[int, int], src: int, dst: int,
               data: bytes) -> None:
    """A `COPY` of blocks of file `src` into file `dst` (all read before any written)."""
    block, pairs = copies(data)
    if not pairs:
        return
    end = max(at for at, _ in pairs) + block
    source = maps.view(src, fds[src], end)
    if source is None:
        raise OSError(f"copy of {block} bytes at {end - block} of fnode {src}: it holds "
                      "less there")
    if _np is None or src == dst:
        chunks = [bytes(source[at:at + block]) for at, _ in pairs]
        for chunk, (_, offset) in zip(chunks, pairs, strict=True):
            os.pwrite(fds[dst], chunk, offset)
        return
    table = _np.array(pairs, _np.int64)
    windows = _np.lib.stride_tricks.sliding_window_view(
        _np.frombuffer(source, _np.uint8), block)
    gathered = windows[table[:, 0]]  # (a copy: before the target is written)
    dst_end = int(table[:, 1].max()) + block
    if os.fstat(fds[dst]).st_size < dst_end:  # (as writes past its end would grow it)
        maps.drop(dst)
        os.ftruncate(fds[dst], dst_end)
    target = maps.view(dst, fds[dst], dst_end)
    assert target is not None
    pages = _np.frombuffer(target, _np.uint8)
    if not (table[:, 1] % block).any():  # (whole blocks of the target: one scatter)
        pages[:len(pages) // block * block].reshape(-1, block)[table[:, 1] // block] = \
            gathered
    else:
        out = _np.lib.stride_tricks.sliding_window_view(pages, block, writeable=True)
        out[table[:, 1]] = gathered


def apply_patch(maps: MappedFiles, fds: dict[int, int], fnode: int, offset: int,
                data: bytes) -> None:
    """A `PATCH` of file `fnode` at `offset`: each block of a file (or zeros) XORed
    with the bytes the patch holds."""
    if _np is None:
        blocks, xored = patched(data)
        table = None
        ends: dict[int, int] = {}
        for src, at, n in blocks:
            if src:
                ends[src] = max(ends.get(src, 0), at + n)
    else:
        raw, xored = patch_table(data)
        table = _np.frombuffer(raw, PATCH_BLOCK_DTYPE)
        ends = {}
        for src in _np.unique(table["fnode"]).tolist():
            if src:
                mine = table[table["fnode"] == src]
                ends[src] = int((mine["offset"] + mine["length"]).max())
    views = {src: maps.view(src, fds[src], end) for src, end in ends.items()}
    if None in views.values():
        raise OSError(f"patch at {offset} of fnode {fnode}: a block it reads is past "
                      "the end of its file")
    written: bytes | memoryview = xored  # (a patch reading no file: as it is)
    if views and table is not None:
        written = _xor_blocks(table, xored, views)  # type: ignore[arg-type]
    elif views:
        written = xor(xored, b"".join(views[src][at:at + n]  # type: ignore[index]
                                      if src else bytes(n) for src, at, n in blocks))
    os.pwrite(fds[fnode], written, offset)


def _xor_blocks(table: Any, xored: memoryview, views: dict[int, memoryview]) -> bytes:
    """`xored` XORed with its blocks' bytes (`table`: their packed rows): each source's
    blocks of one length gathered and XORed at once (others one by one)."""
    assert _np is not None
    np = _np
    out = np.frombuffer(xored, np.uint8).copy()
    lengths = table["length"].astype(np.int64)
    starts = np.cumsum(lengths) - lengths
    offsets = table["offset"].astype(np.int64)
    for src, view in views.items():
        mine = np.flatnonzero(table["fnode"] == src)
        source = np.frombuffer(view, np.uint8)
        n = int(lengths[mine[0]]) if len(mine) else 0
        if n > 0 and (lengths[mine] == n).all():
            gathered = np.lib.stride_tricks.sliding_window_view(source, n)[offsets[mine]]
            windows = np.lib.stride_tricks.sliding_window_view(out, n, writeable=True)
            windows[starts[mine]] ^= gathered
            continue
        for i in mine.tolist():
            at, n, start = int(offsets[i]), int(lengths[i]), int(starts[i])
            out[start:start + n] ^= source[at:at + n]
    result: bytes = out.tobytes()
    return result
