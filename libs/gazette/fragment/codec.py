"""Fragment codecs: compress spools into stored fragments and stream them back.

Stored fragments are compressed whole (`compress`, or a `Compressor` fed as the spool is
read); reads of stored fragments decompress incrementally (`Decompressor`), so a broker
serving a range of a large fragment never holds all of it inflated. Gzip is written at
level 1: on this machine level 1 compresses at ~190 MB/s and level 6 at 18-40 MB/s, for
little gain on journal data. Snappy uses the framing format (``.sz``), as Gazette does.

Every failure is a `CodecError` naming the codec; content whose SHA-1 differs from its
fragment's raises `CorruptFragment`, so a corrupt fragment is never served as good.
"""

from __future__ import annotations

import hashlib
import zlib

import cramjam

from gazette.errors import GazetteError
from gazette.fragment.fragment import Fragment
from gazette.protocol import CompressionCodec

GZIP_LEVEL, ZSTD_LEVEL = 1, 3
#: What the codec libraries raise on bad input.
_FAILURES = (OSError, ValueError, zlib.error, cramjam.CompressionError,
             cramjam.DecompressionError)
_GZIP_CODECS = (CompressionCodec.GZIP, CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION)


class CodecError(GazetteError):
    """Data could not be compressed or decompressed with a codec."""

    def __init__(self, codec: CompressionCodec, what: str) -> None:
        self.codec = codec
        super().__init__(f"{codec.value}: {what}")


class CorruptFragment(GazetteError):
    """A fragment's content does not match its SHA-1."""

    def __init__(self, fragment: Fragment, actual: bytes) -> None:
        self.fragment, self.actual = fragment, actual
        super().__init__(f"{fragment.path}: content SHA-1 is {actual.hex()}, "
                         f"expected {fragment.sha1.hex()}")


def _check(codec: CompressionCodec) -> CompressionCodec:
    if not isinstance(codec, CompressionCodec):
        raise CodecError(CompressionCodec.NONE, f"not a codec: {codec!r}")
    return codec


def compress(codec: CompressionCodec, data: bytes | memoryview) -> bytes:
    """`data` compressed with `codec`, in one call."""
    c = Compressor(codec)
    c.feed(data)
    return c.finish()


def decompress(codec: CompressionCodec, data: bytes | memoryview) -> bytes:
    """`data` decompressed with `codec`, in one call."""
    d = Decompressor(codec)
    out = d.feed(data)
    return out + d.finish()


class Compressor:
    """Compresses chunks fed one by one; `finish()` returns the compressed whole."""

    def __init__(self, codec: CompressionCodec) -> None:
        self.codec = _check(codec)
        self._parts: list[bytes] = []
        self._impl: cramjam.gzip.Compressor | cramjam.snappy.Compressor | \
            cramjam.zstd.Compressor | None = None
        if codec in _GZIP_CODECS:
            self._zlib = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        elif codec is CompressionCodec.SNAPPY:
            self._impl = cramjam.snappy.Compressor()
        elif codec is CompressionCodec.ZSTANDARD:
            self._impl = cramjam.zstd.Compressor(ZSTD_LEVEL)

    def feed(self, chunk: bytes | memoryview) -> None:
        try:
            if self.codec is CompressionCodec.NONE:
                self._parts.append(bytes(chunk))
            elif self.codec in _GZIP_CODECS:
                self._parts.append(self._zlib.compress(chunk))
            else:
                assert self._impl is not None
                self._impl.compress(bytes(chunk))
        except _FAILURES as exc:
            raise CodecError(self.codec, f"compress failed: {exc}") from exc

    def finish(self) -> bytes:
        try:
            if self.codec in _GZIP_CODECS:
                self._parts.append(self._zlib.flush())
            elif self._impl is not None:
                self._parts.append(bytes(self._impl.finish()))
        except _FAILURES as exc:
            raise CodecError(self.codec, f"compress failed: {exc}") from exc
        return b"".join(self._parts)


class Decompressor:
    """Decompresses a stored fragment fed in chunks of any size: `feed` returns what is
    decoded so far, `finish` the rest, raising `CodecError` if the input was truncated."""

    def __init__(self, codec: CompressionCodec) -> None:
        self.codec = _check(codec)
        self._zlib = zlib.decompressobj(31)
        self._buf = bytearray()  # snappy: bytes of an incomplete chunk; zstd: all input
        self._stream_seen = False

    def feed(self, chunk: bytes | memoryview) -> bytes:
        if self.codec is CompressionCodec.NONE:
            return bytes(chunk)
        try:
            if self.codec in _GZIP_CODECS:
                return self._gunzip(bytes(chunk))
            self._buf += chunk
            if self.codec is CompressionCodec.SNAPPY:
                return self._unsnappy()
            return b""  # zstd: decoded at finish (bounded by the fragment's length)
        except _FAILURES as exc:
            raise CodecError(self.codec, f"corrupt input: {exc}") from exc

    def _gunzip(self, data: bytes) -> bytes:
        out = [self._zlib.decompress(data)]
        while self._zlib.eof and self._zlib.unused_data:  # a further gzip member
            rest = self._zlib.unused_data
            self._zlib = zlib.decompressobj(31)
            out.append(self._zlib.decompress(rest))
        return b"".join(out)

    def _unsnappy(self) -> bytes:
        """Decode the complete chunks of the snappy framing format in the buffer."""
        buf, out, pos = self._buf, [], 0
        while len(buf) - pos >= 4:
            kind = buf[pos]
            size = int.from_bytes(buf[pos + 1:pos + 4], "little")
            if len(buf) - pos - 4 < size:
                break
            body = bytes(buf[pos + 4:pos + 4 + size])
            pos += 4 + size
            if kind == 0xFF:
                if body != b"sNaPpY":
                    raise ValueError("bad stream identifier")
                self._stream_seen = True
            elif not self._stream_seen:
                raise ValueError("missing stream identifier")
            elif kind == 0x00:  # compressed: 4-byte masked CRC-32C, then raw snappy
                out.append(bytes(cramjam.snappy.decompress_raw(body[4:])))
            elif kind == 0x01:  # uncompressed: CRC, then the data
                out.append(body[4:])
            elif kind <= 0x7F:
                raise ValueError(f"reserved unskippable chunk type {kind:#x}")
            # 0x80-0xfe: padding and skippable chunks
        del buf[:pos]
        return b"".join(out)

    def finish(self) -> bytes:
        try:
            if self.codec is CompressionCodec.NONE:
                return b""
            if self.codec in _GZIP_CODECS:
                if not self._zlib.eof:
                    raise CodecError(self.codec, "truncated input: gzip stream not ended")
                return b""
            if self.codec is CompressionCodec.SNAPPY:
                if self._buf:
                    raise CodecError(self.codec,
                                     f"truncated input: {len(self._buf)} bytes of a chunk")
                return b""
            data, self._buf = bytes(self._buf), bytearray()
            return bytes(cramjam.zstd.decompress(data)) if data else b""
        except _FAILURES as exc:
            raise CodecError(self.codec, f"corrupt input: {exc}") from exc


class Sha1Verifier:
    """Hashes a fragment's decompressed content as it streams; `verify()` raises
    `CorruptFragment` unless it matches the fragment's SHA-1 and length."""

    def __init__(self, fragment: Fragment) -> None:
        self.fragment = fragment
        self._sha1 = hashlib.sha1()
        self._length = 0

    def update(self, content: bytes | memoryview) -> None:
        self._sha1.update(content)
        self._length += len(content)

    def verify(self) -> None:
        actual = self._sha1.digest()
        if actual != self.fragment.sha1 or self._length != self.fragment.size:
            raise CorruptFragment(self.fragment, actual)
