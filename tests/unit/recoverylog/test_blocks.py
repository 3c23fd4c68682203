"""Copies and patches applied to files: the numpy path and the plain one write the same
bytes; a block past its source's end fails naming it."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from gazette.recoverylog import blocks
from gazette.recoverylog.blocks import MappedFiles, apply_copy, apply_patch
from gazette.recoverylog.ops import copy_data, patch_data, xor


def files(tmp_path: Path, name: str, contents: dict[int, bytes]) -> dict[int, int]:
    fds = {}
    for fnode, data in contents.items():
        path = tmp_path / f"{name}-{fnode}"
        path.write_bytes(data)
        fds[fnode] = os.open(path, os.O_RDWR)
    return fds


def applied(tmp_path: Path, name: str, numpy: bool, monkeypatch: pytest.MonkeyPatch
            ) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """The files after a copy and two patches, and what they should hold (worked out
    here in plain Python)."""
    rng = random.Random(7)
    wal, db = bytes(rng.randbytes(64 * 1048 + 32)), bytes(rng.randbytes(40 * 1024))
    fds = files(tmp_path, name, {1: wal, 2: db, 3: b""})
    maps = MappedFiles()
    # A checkpoint's copies: WAL frames' pages into the database, some past its end.
    pairs = [(32 + 24 + 1048 * i, 1024 * rng.randrange(50)) for i in range(30)]
    want_db = bytearray(db)
    for at, offset in pairs:
        want_db += bytes(max(0, offset + 1024 - len(want_db)))
        want_db[offset:offset + 1024] = wal[at:at + 1024]
    # A patch of file 3: blocks of both files (one of another length) and zeros.
    table = [(1, 32 + 24 + 1048 * 5, 1024), (0, 0, 24), (2, 2048, 1024), (2, 100, 7),
             (1, 32 + 24, 1024)]
    xored = rng.randbytes(sum(n for _, _, n in table))
    sources = {0: bytes(1 << 16), 1: wal, 2: bytes(want_db)}
    bases = b"".join(sources[src][at:at + n] for src, at, n in table)
    want_3 = bytes(10) + xor(xored, bases)
    want_3 += bytes(5000 - len(want_3)) + b"as it is."
    with monkeypatch.context() as m:
        if not numpy:
            m.setattr(blocks, "_np", None)
        apply_copy(maps, fds, 1, 2, copy_data(1024, pairs))
        apply_patch(maps, fds, 3, 10, patch_data(table, xored))
        apply_patch(maps, fds, 3, 5000, patch_data([(0, 0, 9)], b"as it is."))
    maps.close()
    out = {}
    for fnode, fd in fds.items():
        out[fnode] = os.pread(fd, 1 << 20, 0)
        os.close(fd)
    return out, {1: wal, 2: bytes(want_db), 3: want_3}


def test_numpy_and_plain_paths_write_what_they_should(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, numpy in (("fast", True), ("plain", False)):
        got, want = applied(tmp_path, name, numpy, monkeypatch)
        assert got == want, name


def test_a_block_past_its_sources_end_fails_naming_it(tmp_path: Path) -> None:
    fds = files(tmp_path, "short", {1: b"x" * 10, 2: b""})
    maps = MappedFiles()
    with pytest.raises(OSError, match="patch at 0 of fnode 2: a block it reads is past"):
        apply_patch(maps, fds, 2, 0, patch_data([(1, 8, 4)], b"abcd"))
    with pytest.raises(OSError, match="copy of 4 bytes at 8 of fnode 1"):
        apply_copy(maps, fds, 1, 2, copy_data(4, [(8, 0)]))
    maps.close()
    for fd in fds.values():
        os.close(fd)
