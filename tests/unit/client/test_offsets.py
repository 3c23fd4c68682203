"""Offsets and other int64 fields are checked at the client's edge: out-of-range values
are a ValidationError naming the field, not protobuf's ValueError from deep inside."""

from __future__ import annotations

import pytest

from gazette.client import JournalClient
from gazette.client.connection import MAX_INT64, _check_offset
from gazette.errors import ValidationError


def test_check_offset_bounds() -> None:
    assert MAX_INT64 == 2**63 - 1
    assert _check_offset(MAX_INT64, "offset", 0) == MAX_INT64
    assert _check_offset(-1, "offset", -1) == -1
    with pytest.raises(ValidationError) as err:
        _check_offset(MAX_INT64 + 1, "offset", 0)
    assert err.value.field == "offset"
    assert err.value.reason == f"must be at most {MAX_INT64}, got {MAX_INT64 + 1}"
    with pytest.raises(ValidationError, match=r"^page_limit: must be at most 2147483647"):
        _check_offset(2**31, "page_limit", 0, 2**31 - 1)
    with pytest.raises(ValidationError, match=r"^offset: expected an int >= 0, got -1$"):
        _check_offset(-1, "offset", 0)
    for bad in (True, 1.0, "1", None):
        with pytest.raises(ValidationError, match=r"^offset: expected an int"):
            _check_offset(bad, "offset", 0)
    with pytest.raises(ValidationError, match=r"got <\d+-bit integer>$"):
        _check_offset(10**5000, "offset", 0)  # too long to print: still one short line


async def test_client_calls_check_before_sending() -> None:
    # No broker listens at port 1: each call fails on its arguments before any request.
    async with JournalClient("127.0.0.1:1") as client:
        with pytest.raises(ValidationError, match=r"^offset: must be at most"):
            await client.append("a/b", b"x", offset=2**63)
        with pytest.raises(ValidationError, match=r"^offset: must be at most"):
            await anext(client.read("a/b", 10**23))
        with pytest.raises(ValidationError, match=r"^end_offset: must be at most"):
            await anext(client.read("a/b", 0, end_offset=2**64))
        with pytest.raises(ValidationError, match=r"^begin_mod_time: must be at most"):
            await anext(client.fragments("a/b", begin_mod_time=2**63))
        with pytest.raises(ValidationError, match=r"^page_limit: must be at most 2147483647"):
            await anext(client.fragments("a/b", page_limit=2**31))
