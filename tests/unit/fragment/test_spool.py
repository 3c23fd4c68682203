"""Spools: atomic appends (commit or roll back), running SHA-1, roll policy."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.fragment.spool import Spool
from gazette.protocol import FragmentSpec


def test_committed_appends_make_the_fragment(tmp_path: Path) -> None:
    spool = Spool("a/b", 100, tmp_path)
    for chunk in (b"hello ", b"gazette"):
        spool.write(chunk)
    frag = spool.commit()
    assert (frag.begin, frag.end, frag.sha1) == (100, 113, hashlib.sha1(b"hello gazette").digest())
    assert spool.read(106, 100) == b"gazette" and spool.read(113, 5) == b""
    with pytest.raises(ValueError):
        spool.read(99, 1)


def test_rollback_leaves_nothing_of_an_aborted_append(tmp_path: Path) -> None:
    spool = Spool("a/b", 0, tmp_path)
    spool.write(b"kept\n")
    spool.commit()
    spool.write(b"half of an app")  # the client disconnects mid-append
    spool.rollback()
    assert spool.end == 5 and spool.path.stat().st_size == 5
    spool.write(b"next\n")
    frag = spool.commit()
    assert spool.read(0, 100) == b"kept\nnext\n"
    assert frag.sha1 == hashlib.sha1(b"kept\nnext\n").digest()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(st.binary(max_size=50), max_size=4), st.booleans()),
                max_size=12))
def test_any_mix_of_commits_and_rollbacks(tmp_path_factory: pytest.TempPathFactory,
                                          appends: list[tuple[list[bytes], bool]]) -> None:
    spool = Spool("a/b", 7, tmp_path_factory.mktemp("spool"))
    expected = b""
    for chunks, commit in appends:
        for c in chunks:
            spool.write(c)
        if commit:
            spool.commit()
            expected += b"".join(chunks)
        else:
            spool.rollback()
    closed = spool.close()
    assert closed.path.read_bytes() == expected
    assert closed.fragment.end == 7 + len(expected)
    assert closed.fragment.sha1 == hashlib.sha1(expected).digest()


def test_roll_policy_by_length_and_flush_interval(tmp_path: Path) -> None:
    spec = FragmentSpec(length=1024, flush_interval=timedelta(seconds=60))
    spool = Spool("a/b", 0, tmp_path)
    assert not spool.should_roll(spec)  # empty: nothing to flush
    spool.write(b"x" * 10)
    spool.commit()
    assert spool.first_append_at is not None
    assert not spool.should_roll(spec, now=spool.first_append_at + 59)
    assert spool.should_roll(spec, now=spool.first_append_at + 60)
    spool.write(b"x" * 1014)
    spool.commit()
    assert spool.should_roll(FragmentSpec(length=1024, flush_interval=timedelta(0)))
    spool.discard()
    assert not spool.path.exists()
