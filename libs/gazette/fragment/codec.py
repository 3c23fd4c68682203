"""Fragment codecs: compress spools into stored fragments and stream them back.

Formats are the ones Gazette's stores hold, so either side reads the other's fragments:

- ``NONE`` (``.raw``): the content itself.
- ``GZIP`` (``.gz``) and ``GZIP_OFFLOAD_DECOMPRESSION`` (``.gzod``): gzip (RFC 1952),
  written as one member at level 1. On this machine level 1 compresses ndjson at about
  240 MB/s and level 6 at 18-40 MB/s for a few percent smaller files: level 6 would make
  the persister the bottleneck of a busy broker. Reading accepts any number of members
  (as concatenating writers produce). ``.gzod`` only differs in who decompresses: the
  broker serves it still compressed and the reader inflates it.
- ``SNAPPY`` (``.sz``): the snappy *framing* format (stream identifier, then CRC-checked
  chunks of at most 64 KiB), not raw snappy.
- ``ZSTANDARD`` (``.zst``): zstd at level 3, written as a series of independent frames of
  `ZSTD_FRAME_BYTES` of content each (a standard zstd stream: every decoder reads
  concatenated frames). Frames bound what a reader must buffer, and compress faster and
  no worse than one frame here.

One-shot `compress` / `decompress` suit small fragments; `Compressor` compresses a spool
read back in blocks (`drain` hands out what is compressed so far, so nothing is held
twice), and `Decompressor` inflates a stored fragment fed in chunks of any size, emitting
content as soon as it decodes, so a broker serving a range of a large fragment never holds
it all inflated. Gzip inflates with `zlib` (cramjam only decompresses whole streams);
snappy decodes each run of complete chunks with cramjam; zstd decodes each complete frame
with cramjam. A zstd fragment written as a single frame (as other writers, such as Go's
Gazette, produce) therefore decodes only at its end: it is held compressed, then inflated
whole, which is bounded by the fragment's length (``fragment.length``, 512 MiB at most by
default) and is what the one-shot API would do anyway.

Every failure is a `CodecError` naming the codec and what failed, never a raw library
exception. `Sha1Verifier` / `verify` / `FragmentDecoder` check content against its
fragment's SHA-1 and length and raise `CorruptFragment`, so a corrupt fragment is never
served as good.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Final

import cramjam

from gazette.errors import GazetteError
from gazette.fragment.fragment import Fragment
from gazette.protocol import CompressionCodec

GZIP_LEVEL: Final = 1
ZSTD_LEVEL: Final = 3
#: Content per zstd frame written by `Compressor` / `compress`.
ZSTD_FRAME_BYTES: Final = 1 << 20

#: What the codec libraries raise on bad input.
_FAILURES = (OSError, ValueError, zlib.error, cramjam.CompressionError,
             cramjam.DecompressionError)
_GZIP_CODECS = frozenset({CompressionCodec.GZIP, CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION})
_SNAPPY_STREAM_ID: Final = b"\xff\x06\x00\x00sNaPpY"
_ZSTD_MAGIC: Final = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK: Final = 0xFFFFFFF0
_ZSTD_SKIPPABLE: Final = 0x184D2A50  # magic numbers 0x184D2A50-5F


class CodecError(GazetteError):
    """Data could not be compressed or decompressed with a codec (corrupt or truncated
    input, most often)."""

    def __init__(self, codec: CompressionCodec, what: str) -> None:
        self.codec = codec
        self.what = what
        super().__init__(f"{codec.value} codec: {what}")


class CorruptFragment(GazetteError):
    """A stored fragment's content does not match the fragment: its SHA-1 or length
    differs, or it does not decode with its codec (then `actual` is None and the
    `CodecError` is the cause)."""

    def __init__(self, fragment: Fragment, actual: bytes | None,
                 actual_length: int | None = None, *, reason: str = "") -> None:
        self.fragment = fragment
        self.path = fragment.path
        self.expected = fragment.sha1
        self.actual = actual
        self.actual_length = fragment.size if actual_length is None else actual_length
        if not reason:
            reason = f"content SHA-1 is {actual.hex() if actual else '?'}, expected " \
                     f"{fragment.sha1.hex()}"
            if self.actual_length != fragment.size:
                reason += f" (content is {self.actual_length} bytes, expected {fragment.size})"
        super().__init__(f"corrupt fragment {fragment.path}: {reason}")


def _codec(codec: CompressionCodec) -> CompressionCodec:
    # A plain "GZIP" string compares equal to the member but is not it: normalise.
    return CompressionCodec.parse(codec, "codec")


# -- compression ----------------------------------------------------------------------

def compress(codec: CompressionCodec, data: bytes | memoryview) -> bytes:
    """`data` compressed with `codec`, in one call (which releases the GIL while it
    compresses, so it may run in a worker thread)."""
    codec = _codec(codec)
    try:
        if codec is CompressionCodec.NONE:
            return bytes(data)
        if codec in _GZIP_CODECS:
            return bytes(cramjam.gzip.compress(data, level=GZIP_LEVEL))
        if codec is CompressionCodec.SNAPPY:
            return bytes(cramjam.snappy.compress(data))
        return b"".join(_zstd_frames(memoryview(data).cast("B"), final=True)[0]) \
            or _zstd_frame(b"")
    except _FAILURES as exc:
        raise CodecError(codec, f"compress failed: {exc}") from exc


def _zstd_frame(content: bytes | bytearray | memoryview) -> bytes:
    return bytes(cramjam.zstd.compress(content, level=ZSTD_LEVEL))


def _zstd_frames(data: memoryview, final: bool) -> tuple[list[bytes], int]:
    """Frames of the whole `ZSTD_FRAME_BYTES` blocks of `data` (and of the rest if
    `final`), and how many bytes of `data` they hold."""
    frames, pos, n = [], 0, len(data)
    while n - pos >= ZSTD_FRAME_BYTES or (final and pos < n):
        frames.append(_zstd_frame(data[pos:pos + ZSTD_FRAME_BYTES]))
        pos = min(pos + ZSTD_FRAME_BYTES, n)
    return frames, pos


class Compressor:
    """Compresses content fed in chunks: `feed` each chunk, take what is compressed so
    far with `drain` (optional: to write it out as it comes), and `finish` for all the
    rest. Without `drain`, `finish` returns the whole compressed stream."""

    def __init__(self, codec: CompressionCodec) -> None:
        self.codec = _codec(codec)
        self._out: list[bytes] = []
        self._pending = bytearray()  # zstd: content of the next, incomplete frame
        self._fed = False
        self._finished = False
        self._enc: cramjam.gzip.Compressor | cramjam.snappy.Compressor | None = None
        if self.codec in _GZIP_CODECS:
            self._enc = cramjam.gzip.Compressor(GZIP_LEVEL)
        elif self.codec is CompressionCodec.SNAPPY:
            self._enc = cramjam.snappy.Compressor()

    def feed(self, chunk: bytes | memoryview) -> None:
        if self._finished:
            raise CodecError(self.codec, "feed after finish")
        self._fed = True
        try:
            if self.codec is CompressionCodec.NONE:
                self._out.append(bytes(chunk))
            elif self._enc is not None:
                self._enc.compress(chunk if isinstance(chunk, bytes) else bytes(chunk))
            else:
                self._feed_zstd(memoryview(chunk).cast("B"))
        except _FAILURES as exc:
            raise CodecError(self.codec, f"compress failed: {exc}") from exc

    def _feed_zstd(self, chunk: memoryview) -> None:
        if self._pending:
            take = min(ZSTD_FRAME_BYTES - len(self._pending), len(chunk))
            self._pending += chunk[:take]
            chunk = chunk[take:]
            if len(self._pending) < ZSTD_FRAME_BYTES:
                return
            self._out.append(_zstd_frame(self._pending))
            self._pending = bytearray()
        frames, used = _zstd_frames(chunk, final=False)
        self._out.extend(frames)
        self._pending += chunk[used:]

    def drain(self) -> bytes:
        """The compressed bytes produced since the last `drain` (maybe none: codecs
        compress in blocks)."""
        if self._finished:
            return b""
        try:
            if self._enc is not None:
                self._out.append(bytes(self._enc.flush()))
        except _FAILURES as exc:
            raise CodecError(self.codec, f"compress failed: {exc}") from exc
        out, self._out = b"".join(self._out), []
        return out

    def finish(self) -> bytes:
        """The rest of the compressed stream (all of it, if nothing was drained). The
        compressor takes no more input."""
        if self._finished:
            return b""
        self._finished = True
        try:
            if self._enc is not None:
                self._out.append(bytes(self._enc.finish()))
            elif self.codec is CompressionCodec.ZSTANDARD and (self._pending or not self._fed):
                self._out.append(_zstd_frame(self._pending))  # an empty input: one frame
                self._pending = bytearray()
        except _FAILURES as exc:
            raise CodecError(self.codec, f"compress failed: {exc}") from exc
        out, self._out = b"".join(self._out), []
        return out


# -- decompression --------------------------------------------------------------------

def decompress(codec: CompressionCodec, data: bytes | memoryview) -> bytes:
    """`data` decompressed with `codec`, in one call (releasing the GIL while it
    decodes). Empty input is empty content; it accepts what `Decompressor` does."""
    codec = _codec(codec)
    if codec is CompressionCodec.NONE or not len(data):
        return bytes(data)
    lib = cramjam.gzip if codec in _GZIP_CODECS else \
        cramjam.snappy if codec is CompressionCodec.SNAPPY else cramjam.zstd
    try:
        return bytes(lib.decompress(data))
    except _FAILURES as exc:
        raise CodecError(codec, f"corrupt or truncated input: {exc}") from exc


class Decompressor:
    """Decompresses a stored fragment fed in chunks of any size: `feed` returns the
    content decoded so far (maybe none), `finish` the rest, raising `CodecError` if the
    input was truncated or corrupt at any point.

    With a `limit`, content longer than `limit` bytes is an error too (a fragment's
    content has a known length; a gzip stream is never inflated beyond it, so a
    decompression bomb cannot exhaust memory; zstd frames are checked against their
    declared size before they decode, when they declare it)."""

    def __init__(self, codec: CompressionCodec, limit: int | None = None) -> None:
        self.codec = _codec(codec)
        self.limit = limit
        #: Content bytes returned so far.
        self.produced = 0
        self._gz = zlib.decompressobj(31)
        self._gz_started = False  # any gzip input fed
        self._buf = bytearray()  # snappy, zstd: input not decoded yet
        self._pos = 0  # snappy, zstd: scanned up to here in _buf
        self._snappy_started = False  # the snappy stream identifier was seen
        self._zstd_in_frame = False
        self._zstd_trailer = 0  # bytes of checksum after the current frame's last block
        self._zstd_size: int | None = None  # the current frame's declared content size
        self._zstd_last_seen = False
        self._failed: CodecError | None = None

    def feed(self, chunk: bytes | memoryview) -> bytes:
        if self._failed is not None:
            raise self._failed
        if not chunk:
            return b""
        try:
            if self.codec is CompressionCodec.NONE:
                out = bytes(chunk)
            elif self.codec in _GZIP_CODECS:
                out = self._gunzip(chunk)
            else:
                self._buf += chunk
                out = self._unsnappy() if self.codec is CompressionCodec.SNAPPY \
                    else self._unzstd()
        except CodecError as err:
            self._failed = err
            raise
        except _FAILURES as exc:
            self._failed = CodecError(self.codec, f"corrupt input: {exc}")
            raise self._failed from exc
        return self._count(out)

    def _count(self, out: bytes) -> bytes:
        self.produced += len(out)
        if self.limit is not None and self.produced > self.limit:
            self._failed = CodecError(self.codec, f"content exceeds {self.limit} bytes")
            raise self._failed
        return out

    def _room(self) -> int:
        """How many more bytes of output may come (0: unbounded)."""
        return 0 if self.limit is None else self.limit - self.produced + 1

    def _gunzip(self, data: bytes | memoryview) -> bytes:
        self._gz_started = True
        out, produced, room = [], 0, self._room()
        while data:
            if self._gz.eof:  # a further member follows the one that ended
                self._gz = zlib.decompressobj(31)
            part = self._gz.decompress(data, room - produced if room else 0)
            out.append(part)
            produced += len(part)
            if room and produced >= room:
                break  # over the limit (`_count` raises), whatever input is left
            # Input past the end of a member, or left over at the output limit.
            data = self._gz.unused_data if self._gz.eof else self._gz.unconsumed_tail
        return b"".join(out)

    def _unsnappy(self) -> bytes:
        """Decode the complete chunks of the snappy framing format in the buffer."""
        buf, pos, n = self._buf, self._pos, len(self._buf)
        while n - pos >= 4:
            size = int.from_bytes(buf[pos + 1:pos + 4], "little")
            if n - pos - 4 < size:
                break
            if not self._snappy_started:
                if buf[pos:pos + 4 + size] != _SNAPPY_STREAM_ID:
                    raise CodecError(self.codec, "corrupt input: not a snappy framed stream "
                                     "(no stream identifier)")
                self._snappy_started = True
            pos += 4 + size
        if not pos:
            return b""
        # cramjam decodes (and CRC-checks) whole streams: give it the complete chunks,
        # behind a stream identifier (which may repeat within a stream).
        head = _SNAPPY_STREAM_ID if buf[:len(_SNAPPY_STREAM_ID)] != _SNAPPY_STREAM_ID else b""
        with memoryview(buf) as view:
            out = bytes(cramjam.snappy.decompress(head + view[:pos]))
        del buf[:pos]
        self._pos = 0
        return out

    def _unzstd(self) -> bytes:
        """Decode the complete zstd frames in the buffer. Frame boundaries are found by
        walking the frame header and block headers (RFC 8878), without decoding."""
        buf, pos, n = self._buf, self._pos, len(self._buf)
        complete = 0  # the end of the complete frames
        while True:
            if not self._zstd_in_frame:
                if n - pos < 4:
                    break
                magic = int.from_bytes(buf[pos:pos + 4], "little")
                if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE:  # 4-byte length, data
                    if n - pos < 8:
                        break
                    skip = 8 + int.from_bytes(buf[pos + 4:pos + 8], "little")
                    if n - pos < skip:
                        break
                    pos += skip
                    complete = pos
                    continue
                if magic != _ZSTD_MAGIC:
                    raise CodecError(self.codec, "corrupt input: not a zstd frame "
                                     "(bad magic number)")
                if n - pos < 5:
                    break
                fhd = buf[pos + 4]  # the frame header descriptor
                if fhd & 0x08:
                    raise CodecError(self.codec, "corrupt input: reserved frame header bit set")
                single = fhd >> 5 & 1
                fcs_len = (single, 2, 4, 8)[fhd >> 6]
                fcs_at = pos + 5 + (1 - single) + (0, 1, 2, 4)[fhd & 3]
                if n < fcs_at + fcs_len:
                    break
                self._zstd_size = None
                if fcs_len:
                    self._zstd_size = int.from_bytes(buf[fcs_at:fcs_at + fcs_len], "little") \
                        + (256 if fcs_len == 2 else 0)
                    room = self._room()
                    if room and self._zstd_size >= room:
                        raise CodecError(self.codec, f"a frame of {self._zstd_size} bytes: "
                                         f"content exceeds {self.limit} bytes")
                self._zstd_trailer = 4 if fhd & 0x04 else 0
                self._zstd_in_frame, self._zstd_last_seen = True, False
                pos = fcs_at + fcs_len
            if not self._zstd_last_seen:
                if n - pos < 3:
                    break
                header = int.from_bytes(buf[pos:pos + 3], "little")
                kind, size = header >> 1 & 3, header >> 3
                if kind == 3:
                    raise CodecError(self.codec, "corrupt input: reserved block type")
                body = 1 if kind == 1 else size  # an RLE block holds one byte
                if n - pos - 3 < body:
                    break
                pos += 3 + body
                self._zstd_last_seen = bool(header & 1)
                continue
            if n - pos < self._zstd_trailer:
                break
            pos += self._zstd_trailer
            self._zstd_in_frame = False
            complete = pos
        self._pos = pos - complete
        if not complete:
            return b""
        with memoryview(buf) as view:
            out = bytes(cramjam.zstd.decompress(view[:complete]))
        del buf[:complete]
        return out

    def finish(self) -> bytes:
        """The rest of the content; `CodecError` if the input ended mid-stream."""
        if self._failed is not None:
            raise self._failed
        truncated = ""
        if self.codec in _GZIP_CODECS:
            if self._gz_started and not self._gz.eof:
                truncated = "gzip stream not ended"
        elif self._buf:
            truncated = f"{len(self._buf)} bytes of an incomplete " + \
                ("chunk" if self.codec is CompressionCodec.SNAPPY else "frame")
        if truncated:
            self._failed = CodecError(self.codec, f"truncated input: {truncated}")
            raise self._failed
        return b""


# -- verification ---------------------------------------------------------------------

class Sha1Verifier:
    """Hashes a fragment's content as it streams; `verify()` raises `CorruptFragment`
    unless it matches the fragment's SHA-1 and length. `update` raises as soon as there
    is more content than the fragment holds."""

    def __init__(self, fragment: Fragment) -> None:
        self.fragment = fragment
        self._sha1 = hashlib.sha1()
        self.length = 0

    def update(self, content: bytes | memoryview) -> None:
        self._sha1.update(content)
        self.length += len(content)
        if self.length > self.fragment.size:
            raise CorruptFragment(self.fragment, None, self.length,
                                  reason=f"content is longer than {self.fragment.size} bytes")

    def verify(self) -> None:
        actual = self._sha1.digest()
        if actual != self.fragment.sha1 or self.length != self.fragment.size:
            raise CorruptFragment(self.fragment, actual, self.length)


def verify(fragment: Fragment, content: bytes | memoryview) -> None:
    """Raise `CorruptFragment` unless `content` (decompressed) is `fragment`'s."""
    check = Sha1Verifier(fragment)
    check.update(content)
    check.verify()


class FragmentDecoder:
    """A stored fragment's bytes in, its verified content out: a `Decompressor` for the
    fragment's codec (bounded by its length) and a `Sha1Verifier`. Undecodable input and
    content that does not match both raise `CorruptFragment`; content returned by `feed`
    is only known good once `finish` has returned, so a reader must not serve it as final
    before then (or must be ready to fail the read)."""

    def __init__(self, fragment: Fragment) -> None:
        self.fragment = fragment
        self._decoder = Decompressor(fragment.codec, limit=fragment.size)
        self._check = Sha1Verifier(fragment)

    def feed(self, chunk: bytes | memoryview) -> bytes:
        try:
            out = self._decoder.feed(chunk)
        except CodecError as err:
            raise CorruptFragment(self.fragment, None, reason=str(err)) from err
        self._check.update(out)
        return out

    def finish(self) -> bytes:
        try:
            out = self._decoder.finish()
        except CodecError as err:
            raise CorruptFragment(self.fragment, None, reason=str(err)) from err
        self._check.update(out)
        self._check.verify()
        return out
