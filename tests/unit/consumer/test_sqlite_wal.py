"""A WAL's pieces told as patches made in place: played against the files they read,
they write the piece's bytes; a piece not read with room for its blocks is refused."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from gazette.consumer.sqlite_wal import FRAME_HEADER, WAL_HEADER, Mapped, WalFrames
from gazette.recoverylog.blocks import MappedFiles, apply_patch
from gazette.recoverylog.ops import packed_patch, patch_data, patch_room

PAGE = 1024


def frames(rng: random.Random, pages: list[int], commit_size: int) -> bytes:
    """WAL frames of `pages` (the last one ends a transaction of `commit_size` pages)."""
    out = b""
    for i, page in enumerate(pages):
        commit = commit_size if i == len(pages) - 1 else 0
        out += struct.pack(">II", page, commit) + rng.randbytes(FRAME_HEADER - 8)
        out += rng.randbytes(PAGE)
    return out


def test_pieces_patched_in_place_play_back_to_the_wal(tmp_path: Path) -> None:
    rng = random.Random(11)
    db = rng.randbytes(40 * PAGE)  # (pages 1..40; 41 and up are new)
    first = frames(rng, [3, 7, 41, 3, 12], 41)  # (page 3 twice in one piece)
    second = frames(rng, [7, 12, 42, 5], 42)
    wal = rng.randbytes(WAL_HEADER) + first + second
    (tmp_path / "db").write_bytes(db)
    (tmp_path / "wal").write_bytes(wal)
    db_fd, wal_fd = (os.open(tmp_path / name, os.O_RDWR) for name in ("db", "wal"))
    wal_frames = WalFrames(PAGE)
    wal_map = Mapped(wal_fd)
    rows = np.frombuffer(db, np.uint8).reshape(-1, PAGE)
    pieces = []
    end = WAL_HEADER + len(first)
    for start, stop in ((0, end), (end, len(wal))):
        for at, data, pages, before in wal_frames.read(wal_fd, start, stop, 1 << 20,
                                                       room=True):
            patch, sources = wal_frames.patch(data, at, pages, before, wal_map, 1, rows,
                                              2)
            assert len(patch) - len(data) == patch_room(2 * len(pages) + (at == 0))
            pieces.append((at, bytes(packed_patch(patch)), sources))
    assert [s for _, _, s in pieces] == [{1, 2}, {1, 2}]  # (the WAL's, the database's)
    assert wal_frames.npages == 42
    # Played onto a new file (fnode 3) against the WAL (1) and the database (2).
    (tmp_path / "played").write_bytes(b"")
    played_fd = os.open(tmp_path / "played", os.O_RDWR)
    maps = MappedFiles()
    try:
        for at, data, _ in pieces:
            apply_patch(maps, {1: wal_fd, 2: db_fd, 3: played_fd}, 3, at, data)
    finally:
        maps.close()
        wal_map.close()
    assert os.pread(played_fd, len(wal) + 1, 0) == wal
    for fd in (db_fd, wal_fd, played_fd):
        os.close(fd)


def test_a_piece_read_without_room_is_refused(tmp_path: Path) -> None:
    rng = random.Random(12)
    (tmp_path / "wal").write_bytes(rng.randbytes(WAL_HEADER) + frames(rng, [1], 1))
    fd = os.open(tmp_path / "wal", os.O_RDONLY)
    wal_frames, wal_map = WalFrames(PAGE), Mapped(fd)
    ((at, data, pages, before),) = wal_frames.read(fd, 0, os.fstat(fd).st_size, 1 << 20)
    assert isinstance(data, bytes)
    with pytest.raises(TypeError, match=r"read\(room=True\)"):
        wal_frames.patch(data, at, pages, before, wal_map, 1, np.zeros((0, PAGE), np.uint8),
                         2)
    wal_map.close()
    os.close(fd)


def test_a_patch_laid_out_in_one_buffer_is_the_joined_one() -> None:
    table = [(1, 56, 1024), (0, 0, 24)]
    xored = random.Random(13).randbytes(1048)
    packed = struct.pack("<I", 2) + b"".join(struct.pack("<IQI", *b) for b in table)
    assert len(packed) == patch_room(2)
    assert bytes(packed_patch(packed + xored)) == patch_data(table, xored)


def test_frames_seen_are_noted_as_if_read(tmp_path: Path) -> None:
    """Frames only seen (recorded whole: noted later, at once) leave each page's last
    frame, the database's size and the checkpoint's copies as `read` leaves them, and a
    piece read after them finds the versions before it among them."""
    rng = random.Random(13)
    commits = [([3, 7, 41, 3], 41), ([7, 12, 3], 41), ([42, 7], 42), ([5, 42, 12], 42)]
    wal = rng.randbytes(WAL_HEADER) + b"".join(frames(rng, p, n) for p, n in commits)
    (tmp_path / "wal").write_bytes(wal)
    fd = os.open(tmp_path / "wal", os.O_RDONLY)
    read_frames, seen_frames = WalFrames(PAGE), WalFrames(PAGE)
    start = 0
    for pages, size in commits[:3]:
        end = start + (WAL_HEADER if start == 0 else 0) + len(pages) * (FRAME_HEADER + PAGE)
        for _ in read_frames.read(fd, start, end, 1 << 20):
            pass
        for at, length in seen_frames.pieces(start, end, 2 * (FRAME_HEADER + PAGE)):
            seen_frames.seen(at, os.pread(fd, length, at))
            assert seen_frames.npages in (0, 41, 42)
        assert seen_frames.npages == read_frames.npages == size
        start = end
    assert seen_frames.copies() == read_frames.copies()
    assert list(seen_frames.last_pages()) == list(read_frames.last_pages())
    ((_, _, pages, before_seen),) = seen_frames.read(fd, start, len(wal), 1 << 20)
    ((_, _, _, before_read),) = read_frames.read(fd, start, len(wal), 1 << 20)
    assert list(before_seen) == list(before_read)
    assert list(pages) == [5, 42, 12] and before_seen[0] == -1 and min(before_seen[1:]) > 0
    fresh = WalFrames(PAGE)
    fresh.seen(0, wal[:WAL_HEADER + FRAME_HEADER + PAGE])
    with pytest.raises(ValueError, match="not after those seen before"):
        fresh.seen(start, wal[start:])  # (a gap: frames never seen)
    os.close(fd)
