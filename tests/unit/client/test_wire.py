"""The client's pure parts: addresses, content packing and its hand-made encoding, retry
delays, and fetching verified fragments from file:// URLs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gazette.auth import PLAIN, ClientAuth, TLSFiles, auth_for
from gazette.client import RetryPolicy, fetch_fragment, parse_address
from gazette.client.fetch import BLOCK
from gazette.client.wire import MESSAGE_BYTES, Packer, encode_append, pack
from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment, Fragment, compress
from gazette.pb import broker_pb2 as pb
from gazette.protocol import CompressionCodec


@pytest.mark.parametrize(("address", "target"), [
    ("localhost:8080", "localhost:8080"),
    ("http://broker-1.example:8080", "broker-1.example:8080"),
    ("grpc://127.0.0.1:9/", "127.0.0.1:9"),
    ("https://broker:443", "broker:443"), ("grpcs://broker:9", "broker:9"),
    ("[::1]:8080", "[::1]:8080"),
    ("unix:/tmp/broker.sock", "unix:/tmp/broker.sock"),
    ("dns:///broker:8080", "dns:///broker:8080"),
])
def test_addresses(address: str, target: str) -> None:
    assert parse_address(address) == target


def test_an_address_scheme_is_honoured(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """https:// and grpcs:// are TLS (the system's CAs unless files are given);
    http:// and grpc:// are plain text, refused with TLS files; host:port as given."""
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA bundle\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    given = ClientAuth(TLSFiles(ca_file=str(ca)), "tok")
    for address in ("https://b:1", "grpcs://b:1"):
        assert auth_for(address, ClientAuth(token="tok")) == ClientAuth(
            TLSFiles(ca_file=str(ca)), "tok")
        assert auth_for(address, given) is given
    for address in ("b:1", "http://b:1", "grpc://b:1", "unix:/x"):
        assert auth_for(address, PLAIN) is PLAIN
    assert auth_for("b:1", given) is given
    with pytest.raises(ValidationError) as err:
        auth_for("http://b:1", given)
    assert err.value.field == "address" and "https://" in err.value.reason


@pytest.mark.parametrize("address", [
    "", "localhost", "localhost:", ":8080", "localhost:99999", "http://host:80/path",
    "ftp://host:21", "host name:80", "unix:", 8080,
])
def test_bad_addresses_name_the_field(address: object) -> None:
    with pytest.raises(ValidationError) as err:
        parse_address(address)
    assert err.value.field == "address"


def decode(messages: list[bytes]) -> bytes:
    out = b""
    for raw in messages:
        msg = pb.AppendRequest.FromString(raw)
        assert msg.content, "an empty content message would commit the append"
        out += msg.content
    return out


@pytest.mark.parametrize("sizes", [
    [10], [MESSAGE_BYTES], [MESSAGE_BYTES + 1], [3 * MESSAGE_BYTES + 5],
    [100] * 50_000, [0, 7, 0, MESSAGE_BYTES - 7, 1, 2 * MESSAGE_BYTES, 0],
])
def test_packing_makes_full_messages_that_protobuf_decodes(sizes: list[int]) -> None:
    chunks = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    messages, total = pack(chunks)
    assert total == sum(sizes)
    assert all(m.size == MESSAGE_BYTES for m in messages[:-1])
    assert all(0 < m.size <= MESSAGE_BYTES for m in messages)
    assert len(messages) == -(-total // MESSAGE_BYTES)
    assert decode([encode_append(m) for m in messages]) == b"".join(chunks)


def test_packing_slices_views_of_any_buffer() -> None:
    data = bytearray(range(256)) * 10_000
    packer = Packer(limit=1000)
    views = [*packer.add(memoryview(data)), *packer.add(b"tail"), *packer.finish()]
    assert decode([encode_append(m) for m in views]) == bytes(data) + b"tail"
    with pytest.raises(ValidationError, match="content: expected bytes, got str"):
        list(Packer().add("text"))


def test_metadata_and_commit_messages_go_through_protobuf() -> None:
    first = pb.AppendRequest(journal="a/b", offset=7)
    assert pb.AppendRequest.FromString(encode_append(first)) == first
    assert encode_append(pb.AppendRequest()) == b""


def test_retry_delays_grow_with_jitter_up_to_the_cap() -> None:
    delays = list(RetryPolicy(attempts=8, initial_delay=0.1, max_delay=1.0).delays())
    assert len(delays) == 7
    assert 0.05 <= delays[0] <= 0.15
    assert all(d <= 1.5 for d in delays)
    assert list(RetryPolicy(attempts=1).delays()) == []
    assert list(RetryPolicy(attempts=3, jitter=0).delays()) == [0.1, 0.2]
    with pytest.raises(ValidationError, match=r"retry\.attempts"):
        RetryPolicy(attempts=0)


def fragment_file(tmp_path: Path, content: bytes, codec: CompressionCodec
                  ) -> tuple[Fragment, Path]:
    frag = Fragment("a/journal", 100, 100 + len(content), hashlib.sha1(content).digest(), codec)
    path = tmp_path / frag.content_name
    path.write_bytes(compress(codec, content))
    return frag, path


@pytest.mark.parametrize("codec", list(CompressionCodec))
async def test_fetch_fragment_verifies_then_serves_from_an_offset(
        tmp_path: Path, codec: CompressionCodec) -> None:
    content = b"".join(b'{"n": %d}\n' % i for i in range(300_000))
    frag, path = fragment_file(tmp_path, content, codec)
    got = [c async for c in fetch_fragment(path.as_uri(), frag)]
    assert b"".join(got) == content
    assert max(len(c) for c in got) <= BLOCK
    tail = b"".join([c async for c in fetch_fragment(path.as_uri(), frag, frag.begin + 12345)])
    assert tail == content[12345:]
    with pytest.raises(ValidationError, match="offset"):
        [c async for c in fetch_fragment(path.as_uri(), frag, frag.end + 1)]


async def test_a_corrupt_fragment_yields_nothing(tmp_path: Path) -> None:
    content = b"x" * 100_000
    frag, path = fragment_file(tmp_path, content, CompressionCodec.NONE)
    path.write_bytes(content[:-1] + b"y")
    got: list[bytes] = []
    with pytest.raises(CorruptFragment):
        async for chunk in fetch_fragment(path.as_uri(), frag):
            got.append(chunk)
    assert got == []
    path.write_bytes(content[:-1])  # truncated
    with pytest.raises(CorruptFragment):
        [c async for c in fetch_fragment(path.as_uri(), frag)]
    with pytest.raises(FileNotFoundError):
        [c async for c in fetch_fragment((tmp_path / "missing").as_uri(), frag)]
