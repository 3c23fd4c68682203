"""Content fields encoded beside protobuf: byte-for-byte what protobuf would write, and
decoded to what protobuf would read."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from gazette.pb import broker_pb2 as pb
from gazette.protocol.content import (
    AppendContent,
    ReadContent,
    decode_append_request,
    decode_read_response,
    encode_read_response,
    split_field,
    varint,
)

responses = st.builds(
    lambda status, offset, head, frag_end, url, content: (pb.ReadResponse(
        status=status, offset=offset, write_head=head, fragment_url=url,
        fragment=pb.Fragment(journal="a/b", begin=offset, end=frag_end, sha1=b"\x01" * 20),
        header=pb.Header(etcd=pb.Header.Etcd(revision=head))), content),
    st.sampled_from([pb.OK, pb.OFFSET_NOT_YET_AVAILABLE]),
    st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62),
    st.text(max_size=40), st.binary(max_size=3000))


@given(responses)
def test_encoding_matches_protobuf_and_decodes_back(case: tuple[pb.ReadResponse, bytes]
                                                    ) -> None:
    meta, content = case
    whole = pb.ReadResponse()
    whole.CopyFrom(meta)
    whole.content = content
    raw = encode_read_response(ReadContent(meta, content))
    assert raw == whole.SerializeToString()  # content is protobuf's last field
    decoded = decode_read_response(raw)
    assert decoded.content == content and decoded.meta == meta
    # Anything protobuf writes decodes, wherever the content sits.
    moved = bytes([7 << 3 | 2]) + varint(len(content)) + content + meta.SerializeToString()
    decoded = decode_read_response(moved)
    assert decoded.content == content and decoded.meta == meta


def test_plain_messages_pass_through() -> None:
    msg = pb.ReadResponse(status=pb.OK, content=b"abc")
    assert encode_read_response(msg) == msg.SerializeToString()
    assert encode_read_response(ReadContent(pb.ReadResponse(offset=3))) == \
        pb.ReadResponse(offset=3).SerializeToString()
    assert decode_read_response(b"").content == b""


@pytest.mark.parametrize("raw", [
    b"\x3a\x05abc",  # content longer than the message
    b"\x18",  # truncated varint
    b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # overlong varint
    b"\x21\x00\x00",  # fixed64 cut short
    b"\x1b",  # a group: unsupported wire type
])
def test_malformed_messages_raise_decode_errors(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_read_response(raw)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_decode_error(raw: bytes) -> None:
    try:
        rest, content = split_field(raw, 7)
    except DecodeError:
        return
    assert len(rest) + len(content) <= len(raw)


@given(st.text(max_size=30), st.integers(0, 2**62), st.binary(max_size=3000))
def test_append_requests_decode_as_protobuf_reads_them(journal: str, offset: int,
                                                       content: bytes) -> None:
    whole = pb.AppendRequest(journal=journal, offset=offset, content=content)
    part = decode_append_request(whole.SerializeToString())
    assert isinstance(part, AppendContent) and part.content == content
    assert part.meta == pb.AppendRequest(journal=journal, offset=offset)
    only = decode_append_request(pb.AppendRequest(content=content).SerializeToString())
    assert only.content == content and only.meta == pb.AppendRequest()
