"""Malformed HTTP requests to a broker's gateway (a port scan, a typo'd client) are the
client's mistake: each gets its 400 and at most one log line, never a traceback, and
the gateway keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
import pytest

from gazette_broker import BrokerServer

pytestmark = pytest.mark.integration

GARBLED = [
    b"GARBAGE\r\n\r\n",                                    # no path, no version
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # TLS to a plain HTTP port
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",  # a bad header line
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
]


async def send_raw(url: str, raw: bytes) -> bytes:
    """`raw` over a fresh TCP connection to the gateway at `url`; the status line of the
    answer (empty if it closed without one)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_malformed_requests_log_one_line_and_no_traceback(
        broker_server: BrokerServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for raw in GARBLED:
        status_line = await send_raw(broker_server.http_url, raw)
        assert status_line.split(b" ")[1:2] == [b"400"], (raw, status_line)
    # The gateway still serves.
    async with aiohttp.ClientSession() as http, \
            http.get(f"{broker_server.http_url}/healthz") as r:
        assert r.status == 200 and await r.text() == "ok\n"

    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "gazette_broker"))]
    noisy = [(r.name, r.getMessage()) for r in records
             if r.exc_info or r.exc_text or r.stack_info or "Traceback" in r.getMessage()]
    assert noisy == []
    assert "Traceback" not in caplog.text
    malformed = [r for r in records if "malformed HTTP request" in r.getMessage()]
    assert len(malformed) == len(GARBLED), [r.getMessage() for r in records]
    for record in malformed:
        assert record.levelno == logging.DEBUG
        assert "\n" not in record.getMessage(), record.getMessage()
