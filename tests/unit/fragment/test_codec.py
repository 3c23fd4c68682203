"""Fragment codecs and naming: round trips, streaming, corrupt input, SHA-1 checks."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.fragment.codec import (
    CodecError,
    Compressor,
    CorruptFragment,
    Decompressor,
    Sha1Verifier,
    compress,
    decompress,
)
from gazette.fragment.fragment import EMPTY_SHA1, Fragment
from gazette.protocol import CompressionCodec

CODECS = list(CompressionCodec)
LINES = b"".join(b'{"n": %d, "msg": "hello gazette"}\n' % i for i in range(20_000))


def chunked(data: bytes, sizes: list[int]) -> list[bytes]:
    out, i = [], 0
    for n in sizes or [len(data) or 1]:
        out.append(data[i:i + n])
        i += n
    if i < len(data):
        out.append(data[i:])
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_of_journal_like_data(codec: CompressionCodec) -> None:
    stored = compress(codec, LINES)
    assert decompress(codec, stored) == LINES
    if codec is not CompressionCodec.NONE:
        assert len(stored) < len(LINES) / 3


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CODECS), st.binary(max_size=5000),
       st.lists(st.integers(1, 700), max_size=12), st.lists(st.integers(1, 700), max_size=12))
def test_streaming_in_any_chunks_equals_one_shot(
    codec: CompressionCodec, data: bytes, feed_sizes: list[int], read_sizes: list[int]
) -> None:
    c = Compressor(codec)
    for part in chunked(data, feed_sizes):
        c.feed(part)
    stored = c.finish()
    d = Decompressor(codec)
    out = b"".join(d.feed(part) for part in chunked(stored, read_sizes)) + d.finish()
    assert out == data


def test_decompressing_snappy_streams_incrementally() -> None:
    stored = compress(CompressionCodec.SNAPPY, LINES)
    d = Decompressor(CompressionCodec.SNAPPY)
    first = d.feed(stored[: len(stored) // 2])
    assert 0 < len(first) < len(LINES)  # output before the whole input arrived
    assert first + d.feed(stored[len(stored) // 2:]) + d.finish() == LINES


def test_formats_are_the_standard_ones() -> None:
    assert gzip.decompress(compress(CompressionCodec.GZIP, LINES)) == LINES
    assert bytes(cramjam.snappy.decompress(compress(CompressionCodec.SNAPPY, LINES))) == LINES
    assert bytes(cramjam.zstd.decompress(compress(CompressionCodec.ZSTANDARD, LINES))) == LINES
    # Concatenated gzip members (as appending writers produce) read as one stream.
    two = gzip.compress(b"a\n") + gzip.compress(b"b\n")
    assert decompress(CompressionCodec.GZIP, two) == b"a\nb\n"


@pytest.mark.parametrize("codec", [c for c in CODECS if c is not CompressionCodec.NONE])
def test_truncated_and_corrupt_input_raise_codec_errors(codec: CompressionCodec) -> None:
    stored = compress(codec, LINES)
    with pytest.raises(CodecError, match=codec.value):
        decompress(codec, stored[: len(stored) // 2])
    with pytest.raises(CodecError, match=codec.value):
        decompress(codec, os.urandom(2000))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(CODECS), st.binary(max_size=300))
def test_garbage_never_escapes_as_anything_but_codec_error(
    codec: CompressionCodec, garbage: bytes
) -> None:
    with contextlib.suppress(CodecError):  # anything else fails the test
        decompress(codec, garbage)


def test_sha1_verifier_detects_corrupt_content() -> None:
    frag = Fragment("a/b", 100, 100 + len(LINES), hashlib.sha1(LINES).digest())
    ok = Sha1Verifier(frag)
    ok.update(LINES[:10])
    ok.update(LINES[10:])
    ok.verify()
    bad = Sha1Verifier(frag)
    bad.update(LINES[:-1] + b"X")
    with pytest.raises(CorruptFragment, match=frag.path):
        bad.verify()
    short = Sha1Verifier(frag)
    short.update(LINES[:-1])
    with pytest.raises(CorruptFragment):
        short.verify()


# -- naming ---------------------------------------------------------------------------

def test_names_are_the_tutorials() -> None:
    frag = Fragment("example/journal", 0, 43,
                    bytes.fromhex("92a7ee0e4be7a03fd1a3224055a9d6b7bbd6125e"),
                    CompressionCodec.SNAPPY)
    assert frag.path == ("example/journal/0000000000000000-000000000000002b-"
                         "92a7ee0e4be7a03fd1a3224055a9d6b7bbd6125e.sz")
    assert Fragment.parse_path(frag.path) == frag


@given(st.integers(0, 2**40), st.integers(0, 2**40), st.binary(min_size=20, max_size=20),
       st.sampled_from(CODECS), st.sampled_from(["", "date=2026-11-22", "a=1/b=2"]))
def test_paths_round_trip(begin: int, length: int, sha1: bytes, codec: CompressionCodec,
                          postfix: str) -> None:
    frag = Fragment("topic/part-000", begin, begin + length, sha1, codec,
                    path_postfix=postfix)
    assert Fragment.parse_path(frag.path, "s3://b/", 7) == Fragment(
        "topic/part-000", begin, begin + length, sha1, codec, "s3://b/", 7, postfix)
    names = sorted(Fragment("j/x", b, b + 1, EMPTY_SHA1).content_name
                   for b in (begin, length))
    assert names == [Fragment("j/x", b, b + 1, EMPTY_SHA1).content_name
                     for b in sorted((begin, length))]  # names sort in offset order


@pytest.mark.parametrize("path", [
    "no-folder-0000000000000000-0000000000000001-" + "0" * 40 + ".raw",
    "j/x/0000000000000000-0000000000000001-" + "0" * 40 + ".bz2",
    "j/x/0000000000000002-0000000000000001-" + "0" * 40 + ".raw",
    "j/x/00000000000000000-0000000000000001-" + "0" * 40 + ".raw",
    "j/x/readme.txt",
    "/j/0000000000000000-0000000000000001-" + "0" * 40 + ".raw",
])
def test_non_fragment_paths_are_rejected(path: str) -> None:
    with pytest.raises(ValidationError):
        Fragment.parse_path(path)


# -- bounds and frames ----------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_a_limit_refuses_content_longer_than_the_fragment(codec: CompressionCodec) -> None:
    stored = compress(codec, LINES)
    d = Decompressor(codec, limit=len(LINES) - 1)
    with pytest.raises(CodecError, match="exceeds"):
        for part in chunked(stored, [4096] * (len(stored) // 4096 + 1)):
            d.feed(part)
        d.finish()
    exact = Decompressor(codec, limit=len(LINES))
    assert exact.feed(stored) + exact.finish() == LINES


def test_zstd_streams_decode_frame_by_frame() -> None:
    from gazette.fragment.codec import ZSTD_FRAME_BYTES
    data = LINES * (3 * ZSTD_FRAME_BYTES // len(LINES) + 1)
    c = Compressor(CompressionCodec.ZSTANDARD)
    c.feed(data)
    drained = c.drain()
    stored = drained + c.finish()
    assert drained  # whole frames are handed out before finish
    d = Decompressor(CompressionCodec.ZSTANDARD)
    first = d.feed(stored[: len(stored) // 2])
    assert ZSTD_FRAME_BYTES <= len(first) < len(data)
    assert first + d.feed(stored[len(stored) // 2:]) + d.finish() == data


def test_fragment_decoder_reports_undecodable_and_mismatched_content() -> None:
    from gazette.fragment.codec import FragmentDecoder
    frag = Fragment("a/b", 0, len(LINES), hashlib.sha1(LINES).digest(),
                    CompressionCodec.SNAPPY)
    stored = compress(CompressionCodec.SNAPPY, LINES)
    ok = FragmentDecoder(frag)
    assert ok.feed(stored) + ok.finish() == LINES
    with pytest.raises(CorruptFragment, match="corrupt fragment"):
        bad = FragmentDecoder(frag)
        bad.feed(b"\x00" + stored[1:])
        bad.finish()
    other = compress(CompressionCodec.SNAPPY, LINES[:-1] + b"X")
    with pytest.raises(CorruptFragment, match="SHA-1"):
        wrong = FragmentDecoder(frag)
        wrong.feed(other)
        wrong.finish()
